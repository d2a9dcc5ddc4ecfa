/* heatmap.c - render a profile's CA as a tiled grid of per-layer panels, write it as PNG. */
#include "heatmap.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "export.h"

#define STB_IMAGE_WRITE_IMPLEMENTATION
#define STBI_WRITE_NO_STDIO
#include <stb/stb_image_write.h>

/* ---------------------------------------------------------------- font */

/* 5 columns x 8 rows per glyph, '#' = ink; rows 0-6 hold capitals and digits, row 7 descenders. */
static const struct glyph { char c; const char *art; } font[] = {
    { '0', ".###." "#...#" "#..##" "#.#.#" "##..#" "#...#" ".###." "....." },
    { '1', "..#.." ".##.." "..#.." "..#.." "..#.." "..#.." ".###." "....." },
    { '2', ".###." "#...#" "....#" "...#." "..#.." ".#..." "#####" "....." },
    { '3', "#####" "...#." "..#.." "...#." "....#" "#...#" ".###." "....." },
    { '4', "...#." "..##." ".#.#." "#..#." "#####" "...#." "...#." "....." },
    { '5', "#####" "#...." "####." "....#" "....#" "#...#" ".###." "....." },
    { '6', "..##." ".#..." "#...." "####." "#...#" "#...#" ".###." "....." },
    { '7', "#####" "....#" "...#." "..#.." ".#..." ".#..." ".#..." "....." },
    { '8', ".###." "#...#" "#...#" ".###." "#...#" "#...#" ".###." "....." },
    { '9', ".###." "#...#" "#...#" ".####" "....#" "...#." ".##.." "....." },
    { 'A', ".###." "#...#" "#...#" "#####" "#...#" "#...#" "#...#" "....." },
    { 'B', "####." "#...#" "#...#" "####." "#...#" "#...#" "####." "....." },
    { 'C', ".###." "#...#" "#...." "#...." "#...." "#...#" ".###." "....." },
    { 'D', "###.." "#..#." "#...#" "#...#" "#...#" "#..#." "###.." "....." },
    { 'E', "#####" "#...." "#...." "####." "#...." "#...." "#####" "....." },
    { 'F', "#####" "#...." "#...." "####." "#...." "#...." "#...." "....." },
    { 'G', ".###." "#...#" "#...." "#.###" "#...#" "#...#" ".####" "....." },
    { 'H', "#...#" "#...#" "#...#" "#####" "#...#" "#...#" "#...#" "....." },
    { 'I', ".###." "..#.." "..#.." "..#.." "..#.." "..#.." ".###." "....." },
    { 'J', "..###" "...#." "...#." "...#." "...#." "#..#." ".##.." "....." },
    { 'K', "#...#" "#..#." "#.#.." "##..." "#.#.." "#..#." "#...#" "....." },
    { 'L', "#...." "#...." "#...." "#...." "#...." "#...." "#####" "....." },
    { 'M', "#...#" "##.##" "#.#.#" "#.#.#" "#...#" "#...#" "#...#" "....." },
    { 'N', "#...#" "#...#" "##..#" "#.#.#" "#..##" "#...#" "#...#" "....." },
    { 'O', ".###." "#...#" "#...#" "#...#" "#...#" "#...#" ".###." "....." },
    { 'P', "####." "#...#" "#...#" "####." "#...." "#...." "#...." "....." },
    { 'Q', ".###." "#...#" "#...#" "#...#" "#.#.#" "#..#." ".##.#" "....." },
    { 'R', "####." "#...#" "#...#" "####." "#.#.." "#..#." "#...#" "....." },
    { 'S', ".####" "#...." "#...." ".###." "....#" "....#" "####." "....." },
    { 'T', "#####" "..#.." "..#.." "..#.." "..#.." "..#.." "..#.." "....." },
    { 'U', "#...#" "#...#" "#...#" "#...#" "#...#" "#...#" ".###." "....." },
    { 'V', "#...#" "#...#" "#...#" "#...#" "#...#" ".#.#." "..#.." "....." },
    { 'W', "#...#" "#...#" "#...#" "#.#.#" "#.#.#" "#.#.#" ".#.#." "....." },
    { 'X', "#...#" "#...#" ".#.#." "..#.." ".#.#." "#...#" "#...#" "....." },
    { 'Y', "#...#" "#...#" ".#.#." "..#.." "..#.." "..#.." "..#.." "....." },
    { 'Z', "#####" "....#" "...#." "..#.." ".#..." "#...." "#####" "....." },
    { 'a', "....." "....." ".###." "....#" ".####" "#...#" ".####" "....." },
    { 'b', "#...." "#...." "#.##." "##..#" "#...#" "#...#" "####." "....." },
    { 'c', "....." "....." ".###." "#...." "#...." "#...#" ".###." "....." },
    { 'd', "....#" "....#" ".##.#" "#..##" "#...#" "#...#" ".####" "....." },
    { 'e', "....." "....." ".###." "#...#" "#####" "#...." ".###." "....." },
    { 'f', "..##." ".#..#" ".#..." "###.." ".#..." ".#..." ".#..." "....." },
    { 'g', "....." "....." ".####" "#...#" "#...#" ".####" "....#" ".###." },
    { 'h', "#...." "#...." "#.##." "##..#" "#...#" "#...#" "#...#" "....." },
    { 'i', "..#.." "....." ".##.." "..#.." "..#.." "..#.." ".###." "....." },
    { 'j', "...#." "....." "..##." "...#." "...#." "...#." "#..#." ".##.." },
    { 'k', "#...." "#...." "#..#." "#.#.." "##..." "#.#.." "#..#." "....." },
    { 'l', ".##.." "..#.." "..#.." "..#.." "..#.." "..#.." ".###." "....." },
    { 'm', "....." "....." "##.#." "#.#.#" "#.#.#" "#...#" "#...#" "....." },
    { 'n', "....." "....." "#.##." "##..#" "#...#" "#...#" "#...#" "....." },
    { 'o', "....." "....." ".###." "#...#" "#...#" "#...#" ".###." "....." },
    { 'p', "....." "....." "####." "#...#" "#...#" "####." "#...." "#...." },
    { 'q', "....." "....." ".####" "#...#" "#...#" ".####" "....#" "....#" },
    { 'r', "....." "....." "#.##." "##..#" "#...." "#...." "#...." "....." },
    { 's', "....." "....." ".####" "#...." ".###." "....#" "####." "....." },
    { 't', ".#..." ".#..." "###.." ".#..." ".#..." ".#..#" "..##." "....." },
    { 'u', "....." "....." "#...#" "#...#" "#...#" "#..##" ".##.#" "....." },
    { 'v', "....." "....." "#...#" "#...#" "#...#" ".#.#." "..#.." "....." },
    { 'w', "....." "....." "#...#" "#...#" "#.#.#" "#.#.#" ".#.#." "....." },
    { 'x', "....." "....." "#...#" ".#.#." "..#.." ".#.#." "#...#" "....." },
    { 'y', "....." "....." "#...#" "#...#" "#...#" ".####" "....#" ".###." },
    { 'z', "....." "....." "#####" "...#." "..#.." ".#..." "#####" "....." },
    { ' ', "....." "....." "....." "....." "....." "....." "....." "....." },
    { '.', "....." "....." "....." "....." "....." ".##.." ".##.." "....." },
    { ',', "....." "....." "....." "....." "....." ".##.." "..#.." ".#..." },
    { ':', "....." ".##.." ".##.." "....." ".##.." ".##.." "....." "....." },
    { ';', "....." ".##.." ".##.." "....." ".##.." "..#.." ".#..." "....." },
    { '-', "....." "....." "....." ".###." "....." "....." "....." "....." },
    { '+', "....." "..#.." "..#.." "#####" "..#.." "..#.." "....." "....." },
    { '=', "....." "....." "#####" "....." "#####" "....." "....." "....." },
    { '/', "....#" "....#" "...#." "..#.." ".#..." "#...." "#...." "....." },
    { '(', "...#." "..#.." ".#..." ".#..." ".#..." "..#.." "...#." "....." },
    { ')', ".#..." "..#.." "...#." "...#." "...#." "..#.." ".#..." "....." },
    { '[', ".###." ".#..." ".#..." ".#..." ".#..." ".#..." ".###." "....." },
    { ']', ".###." "...#." "...#." "...#." "...#." "...#." ".###." "....." },
    { '%', "##..." "##..#" "...#." "..#.." ".#..." "#..##" "...##" "....." },
    { '_', "....." "....." "....." "....." "....." "....." "#####" "....." },
    { '\'', "..#.." "..#.." ".#..." "....." "....." "....." "....." "....." },
    { '"', ".#.#." ".#.#." "....." "....." "....." "....." "....." "....." },
    { '#', ".#.#." ".#.#." "#####" ".#.#." "#####" ".#.#." ".#.#." "....." },
    { '<', "...#." "..#.." ".#..." "#...." ".#..." "..#.." "...#." "....." },
    { '>', ".#..." "..#.." "...#." "....#" "...#." "..#.." ".#..." "....." },
    { '*', "....." "..#.." "#.#.#" ".###." "#.#.#" "..#.." "....." "....." },
    { '!', "..#.." "..#.." "..#.." "..#.." "..#.." "....." "..#.." "....." },
    { '?', ".###." "#...#" "....#" "...#." "..#.." "....." "..#.." "....." },
    { '|', "..#.." "..#.." "..#.." "..#.." "..#.." "..#.." "..#.." "..#.." },
};
/* Characters without a glyph are drawn as a box, so a missing one is visible, not silent. */
static const char box_art[] = "#####" "#...#" "#...#" "#...#" "#...#" "#...#" "#####" ".....";

#define GLYPH_W 5
#define GLYPH_H 8
#define GLYPH_ADVANCE 6

static const char *glyph_art(char c)
{
    for (size_t i = 0; i < sizeof font / sizeof *font; i++)
        if (font[i].c == c) return font[i].art;
    return box_art;
}

int heatmap_text_width(const char *s, int scale)
{
    int n = (int)strlen(s);
    return n ? (n * GLYPH_ADVANCE - 1) * scale : 0;
}

static void fill(heatmap_image *img, int x0, int y0, int w, int h, const uint8_t rgb[3])
{
    int x1 = x0 + w, y1 = y0 + h;
    if (x0 < 0) x0 = 0;
    if (y0 < 0) y0 = 0;
    if (x1 > img->w) x1 = img->w;
    if (y1 > img->h) y1 = img->h;
    for (int y = y0; y < y1; y++)
        for (int x = x0; x < x1; x++) memcpy(img->rgb + ((size_t)y * img->w + x) * 3, rgb, 3);
}

void heatmap_draw_text(heatmap_image *img, int x, int y, const char *s, int scale, const uint8_t rgb[3], int rotated)
{
    const int len = heatmap_text_width(s, scale);
    for (int i = 0; s[i]; i++) {
        const char *art = glyph_art(s[i]);
        const int o = i * GLYPH_ADVANCE * scale;   /* offset along the writing direction */
        for (int gy = 0; gy < GLYPH_H; gy++)
            for (int gx = 0; gx < GLYPH_W; gx++) {
                if (art[gy * GLYPH_W + gx] != '#') continue;
                if (!rotated) fill(img, x + o + gx * scale, y + gy * scale, scale, scale, rgb);
                else          fill(img, x + gy * scale, y + len - o - (gx + 1) * scale, scale, scale, rgb);
            }
    }
}

/* ---------------------------------------------------------------- colours */

/* matplotlib's viridis sampled at nine points, linearly interpolated between them */
static const uint8_t viridis[9][3] = {
    { 68, 1, 84 },   { 71, 45, 123 },  { 59, 82, 139 },  { 44, 114, 142 }, { 33, 145, 140 },
    { 40, 174, 128 }, { 94, 201, 98 }, { 173, 220, 48 }, { 253, 231, 37 },
};

static void colour(double t, uint8_t out[3])
{
    if (!(t > 0)) t = 0;
    if (t > 1) t = 1;
    double x = t * 8;
    int i = (int)x;
    if (i > 7) i = 7;
    double f = x - i;
    for (int c = 0; c < 3; c++) out[c] = (uint8_t)lrint(viridis[i][c] + f * (viridis[i + 1][c] - viridis[i][c]));
}

static const uint8_t WHITE[3] = { 255, 255, 255 }, INK[3] = { 34, 34, 34 }, GREY[3] = { 150, 150, 150 };
static const uint8_t BLACK[3] = { 0, 0, 0 };

/* ---------------------------------------------------------------- layout */

enum { MARGIN = 24, TS = 2, TITLE_S = 3, GAP = 6, BAR_W = 22 };

typedef struct layout {
    int cw, ch;                 /* one cell */
    int sep, group;             /* gap between KV-head groups of `group` query heads */
    int left, top, bottom, right;   /* margins of a panel slot around its cells */
    int slot_w, slot_h, cols, rows;
    int header, bar_x, bar_area;
    int tick_step;
} layout;

static int clampi(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

static void plan(const profile *p, layout *L)
{
    const int C = p->n_chunk, H = p->n_head;
    char buf[16];
    L->cw = clampi(320 / C, 3, 16);
    L->ch = clampi(L->cw < 200 / H ? L->cw : 200 / H, 2, 16);
    snprintf(buf, sizeof buf, "%d", H - 1);
    L->left = GAP + GLYPH_H * TS + GAP + heatmap_text_width(buf, TS) + GAP;
    L->top = GLYPH_H * TS + GAP;
    L->bottom = 4 + GAP + (GLYPH_H - 1) * TS + GAP + GLYPH_H * TS + 2 * GAP;
    L->right = 3 * GAP;
    L->slot_w = L->left + C * L->cw + L->right;
    L->group = p->n_head / p->n_kv_head;
    L->sep = p->n_kv_head > 1 && L->group > 1 ? 2 : 0;
    L->slot_h = L->top + H * L->ch + (p->n_kv_head - 1) * L->sep + L->bottom;
    /* chunk ticks every power-of-two step that leaves room for a three-digit label */
    L->tick_step = 1;
    while (L->tick_step * L->cw < heatmap_text_width("000", TS) + 3 * GAP) L->tick_step *= 2;
    L->header = MARGIN + GLYPH_H * TITLE_S + GAP + GLYPH_H * TS + 2 * GAP;
    L->bar_area = 2 * GAP +
                  (BAR_W + GAP + heatmap_text_width("0.000", TS) > heatmap_text_width("mean CA", TS)
                       ? BAR_W + GAP + heatmap_text_width("0.000", TS)
                       : heatmap_text_width("mean CA", TS)) +
                  MARGIN;
    /* the number of columns that brings the picture closest to 16:10 */
    double best = 1e30;
    for (int cols = 1; cols <= p->n_layer; cols++) {
        int rows = (p->n_layer + cols - 1) / cols;
        double w = 2.0 * MARGIN + cols * L->slot_w + L->bar_area, h = L->header + rows * L->slot_h + MARGIN;
        double score = fabs(log(w / h / 1.6));
        if (score < best - 1e-9) best = score, L->cols = cols, L->rows = rows;
    }
    L->bar_x = MARGIN + L->cols * L->slot_w + 2 * GAP;
}

/* top of head h's row inside a panel: KV-head groups are set apart by a small gap */
static int row_y(const layout *L, int h) { return h * L->ch + h / L->group * L->sep; }

static void draw_panel(heatmap_image *img, const profile *p, int ki, int layer, int mark_f, double lo, double hi,
                       const layout *L, int x0, int y0)
{
    const int C = p->n_chunk, H = p->n_head;
    const int gx = x0 + L->left, gy = y0 + L->top, gw = C * L->cw, gh = row_y(L, H - 1) + L->ch;
    char buf[64];
    snprintf(buf, sizeof buf, "layer %d", layer);
    heatmap_draw_text(img, gx + (gw - heatmap_text_width(buf, TS)) / 2, y0, buf, TS, INK, 0);
    fill(img, gx - 1, gy - 1, gw + 2, gh + 2, GREY);   /* frame */
    fill(img, gx, gy, gw, gh, WHITE);
    int16_t rank[1024];
    for (int h = 0; h < H; h++) {
        const double *ca = profile_ca(p, ki, layer, h);
        for (int c = 0; c < C; c++) {
            uint8_t rgb[3];
            colour((ca[c] - lo) / (hi - lo), rgb);
            fill(img, gx + c * L->cw, gy + row_y(L, h), L->cw, L->ch, rgb);
        }
        if (mark_f <= 0) continue;
        export_rank_at(p, ki, layer, h, rank);
        int dot = L->cw < L->ch ? L->cw : L->ch;
        dot = dot >= 8 ? dot / 4 + 1 : dot >= 4 ? 2 : 1;
        for (int i = 0; i < mark_f && i < C; i++) {
            uint8_t rgb[3];
            colour((ca[rank[i]] - lo) / (hi - lo), rgb);
            double lum = 0.299 * rgb[0] + 0.587 * rgb[1] + 0.114 * rgb[2];
            fill(img, gx + rank[i] * L->cw + (L->cw - dot) / 2, gy + row_y(L, h) + (L->ch - dot) / 2, dot, dot,
                 lum > 140 ? BLACK : WHITE);
        }
    }
    /* head axis: first and last head, "head" written upwards */
    const int th = (GLYPH_H - 1) * TS;
    for (int h = 0; h < H; h += H - 1 > 0 ? H - 1 : 1) {
        snprintf(buf, sizeof buf, "%d", h);
        heatmap_draw_text(img, gx - GAP - heatmap_text_width(buf, TS), gy + row_y(L, h) + (L->ch - th) / 2, buf, TS,
                          INK, 0);
    }
    heatmap_draw_text(img, x0 + GAP, gy + (gh - heatmap_text_width("head", TS)) / 2, "head", TS, INK, 1);
    /* chunk axis: ticks every tick_step chunks and at the last one when there is room */
    const int ty = gy + gh + 1;
    int ticks[1024], n_tick = 0;
    for (int c = 0; c < C; c += L->tick_step) ticks[n_tick++] = c;
    if (ticks[n_tick - 1] != C - 1 && (C - 1 - ticks[n_tick - 1]) * 2 >= L->tick_step) ticks[n_tick++] = C - 1;
    for (int i = 0; i < n_tick; i++) {
        int cx = gx + ticks[i] * L->cw + L->cw / 2;
        fill(img, cx, ty, 1, 4, INK);
        snprintf(buf, sizeof buf, "%d", ticks[i]);
        heatmap_draw_text(img, cx - heatmap_text_width(buf, TS) / 2, ty + 4 + GAP / 2, buf, TS, INK, 0);
    }
    heatmap_draw_text(img, gx + (gw - heatmap_text_width("chunk", TS)) / 2, ty + 4 + GAP / 2 + th + GAP, "chunk", TS,
                      INK, 0);
}

int heatmap_render(const profile *p, int ki, int mark_f, heatmap_image *img, char *err)
{
    memset(img, 0, sizeof *img);
    if (ki < 0 || ki >= p->n_k) return fasa_error(err, FASA_EARG, "heatmap: K index %d is not in the profile", ki);
    if (p->n_chunk > 1024) return fasa_error(err, FASA_EARG, "heatmap: too many chunks (%d)", p->n_chunk);
    layout L;
    plan(p, &L);
    char title[128], sub[320];
    snprintf(title, sizeof title, "contextual agreement per head and frequency chunk, K=%d", p->ks[ki]);
    int n = snprintf(sub, sizeof sub, "%s, %d layers, %d heads (%d KV), %d chunks (%s: dims %s); %s", p->arch,
                     p->n_layer, p->n_head, p->n_kv_head, p->n_chunk, p->chunks == CHUNKS_PLANE ? "plane" : "adjacent",
                     p->chunks == CHUNKS_PLANE ? "j, j+d/2" : "2j, 2j+1", export_chunk_note(p->chunks));
    if (mark_f > 0 && n > 0 && (size_t)n < sizeof sub)
        snprintf(sub + n, sizeof sub - n, "; dots: each head's top %d", mark_f);
    img->w = 2 * MARGIN + L.cols * L.slot_w + L.bar_area - MARGIN;
    int text_w = heatmap_text_width(title, TITLE_S), sub_w = heatmap_text_width(sub, TS);
    if (img->w < 2 * MARGIN + text_w) img->w = 2 * MARGIN + text_w;
    if (img->w < 2 * MARGIN + sub_w) img->w = 2 * MARGIN + sub_w;
    img->h = L.header + L.rows * L.slot_h + MARGIN;
    int bar_h = L.rows * L.slot_h - L.top - L.bottom;
    if (bar_h > 480) bar_h = 480;
    if (bar_h < 64) bar_h = 64;
    if (L.header + L.top + bar_h + MARGIN > img->h) img->h = L.header + L.top + bar_h + MARGIN + GLYPH_H * TS;
    if ((double)img->w * img->h > 1e8)
        return fasa_error(err, FASA_EARG, "heatmap: a %dx%d image is too large to draw", img->w, img->h);
    img->rgb = malloc((size_t)img->w * img->h * 3);
    if (!img->rgb) return fasa_error(err, FASA_ENOMEM, "heatmap: out of memory for a %dx%d image", img->w, img->h);
    memset(img->rgb, 255, (size_t)img->w * img->h * 3);

    /* one colour scale for the whole model */
    double lo = 1e30, hi = -1e30;
    for (int l = 0; l < p->n_layer; l++)
        for (int h = 0; h < p->n_head; h++) {
            const double *ca = profile_ca(p, ki, l, h);
            for (int c = 0; c < p->n_chunk; c++) lo = fmin(lo, ca[c]), hi = fmax(hi, ca[c]);
        }
    double span_lo = lo, span_hi = hi > lo ? hi : lo + 1e-6;

    char buf[64];
    heatmap_draw_text(img, MARGIN, MARGIN, title, TITLE_S, INK, 0);
    heatmap_draw_text(img, MARGIN, MARGIN + GLYPH_H * TITLE_S + GAP, sub, TS, INK, 0);

    for (int l = 0; l < p->n_layer; l++) {
        int x0 = MARGIN + (l % L.cols) * L.slot_w, y0 = L.header + (l / L.cols) * L.slot_h;
        draw_panel(img, p, ki, l, mark_f, span_lo, span_hi, &L, x0, y0);
    }

    /* colour bar: max at the top, min at the bottom */
    const int bx = L.bar_x, by = L.header + L.top;
    heatmap_draw_text(img, bx, by - GLYPH_H * TS - GAP + (GLYPH_H * TS - (GLYPH_H - 1) * TS), "mean CA", TS, INK, 0);
    fill(img, bx - 1, by - 1, BAR_W + 2, bar_h + 2, GREY);
    for (int y = 0; y < bar_h; y++) {
        uint8_t rgb[3];
        colour(1.0 - (double)y / (bar_h - 1), rgb);
        fill(img, bx, by + y, BAR_W, 1, rgb);
    }
    const int th = (GLYPH_H - 1) * TS, tx = bx + BAR_W + GAP;
    const double marks[3] = { hi, (lo + hi) / 2, lo };
    const int ys[3] = { by, by + bar_h / 2, by + bar_h - 1 };
    for (int i = 0; i < 3; i++) {
        snprintf(buf, sizeof buf, "%.3f", marks[i]);
        fill(img, bx + BAR_W - 5, ys[i], 5, 1, INK);   /* ticks inside the bar: outside they read as minus signs */
        int y = ys[i] - th / 2;
        if (i == 0) y = by;
        if (i == 2) y = by + bar_h - th;
        heatmap_draw_text(img, tx, y, buf, TS, INK, 0);
    }
    return 0;
}

void heatmap_image_free(heatmap_image *img)
{
    free(img->rgb);
    memset(img, 0, sizeof *img);
}

typedef struct membuf { unsigned char *data; size_t len, cap; int failed; } membuf;

static void membuf_put(void *ctx, void *data, int size)
{
    membuf *m = ctx;
    if (m->failed || size <= 0) return;
    if (m->len + size > m->cap) {
        size_t cap = m->cap ? m->cap : 1 << 16;
        while (cap < m->len + size) cap *= 2;
        unsigned char *n = realloc(m->data, cap);
        if (!n) { m->failed = 1; return; }
        m->data = n, m->cap = cap;
    }
    memcpy(m->data + m->len, data, size);
    m->len += size;
}

int heatmap_write_png(const heatmap_image *img, const char *path, char *err)
{
    membuf m = { 0 };
    int ok = stbi_write_png_to_func(membuf_put, &m, img->w, img->h, 3, img->rgb, img->w * 3);
    if (!ok || m.failed) {
        free(m.data);
        return fasa_error(err, FASA_ENOMEM, "cannot encode '%s' as PNG (%dx%d)", path, img->w, img->h);
    }
    int rc = fasa_write_file(path, m.data, m.len, err);
    free(m.data);
    return rc;
}
