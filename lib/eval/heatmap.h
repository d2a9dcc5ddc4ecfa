/* heatmap.h - a profile's contextual agreement as a picture (the paper's Fig. 2 layout).
 *
 *   heatmap_image img;
 *   if (heatmap_render(&prof, profile_k_index(&prof, 256), 8, &img, err) < 0) ...;   // mark top 8
 *   if (heatmap_write_png(&img, "ca.png", err) < 0) ...;
 *   heatmap_image_free(&img);
 *
 * One panel per layer, heads as rows (KV-head groups set apart) and chunks as columns (chunk 0 on
 * the left: the highest frequency under "plane"), tiled in a grid; one colour scale (viridis) from
 * the smallest to the largest mean CA at that K over the whole model, drawn as a bar with its min,
 * middle and max labelled. With mark_f > 0 each head's top mark_f chunks get a small dot. Text uses
 * a built-in 5x7 bitmap font (printable ASCII; anything else is drawn as a box).
 */
#ifndef FASA_HEATMAP_H
#define FASA_HEATMAP_H

#include <stdint.h>

#include "profile.h"

typedef struct heatmap_image {
    int w, h;
    uint8_t *rgb;   /* (h, w, 3) */
} heatmap_image;

int  heatmap_render(const profile *p, int ki, int mark_f, heatmap_image *img, char *err);
void heatmap_image_free(heatmap_image *img);
/* PNG through stb_image_write, written atomically (temp file + rename). */
int  heatmap_write_png(const heatmap_image *img, const char *path, char *err);

/* Text primitives (exposed for tests): width in pixels of s at an integer scale, and drawing
 * with the top-left corner at (x, y); rotated draws bottom-to-top (for a vertical axis label). */
int  heatmap_text_width(const char *s, int scale);
void heatmap_draw_text(heatmap_image *img, int x, int y, const char *s, int scale, const uint8_t rgb[3], int rotated);

#endif
