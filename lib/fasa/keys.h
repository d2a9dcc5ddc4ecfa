/* keys.h - the order of each KV head's key dims in the cache, from a calibration profile: the
 * layout that lets the token importance predictor stream one contiguous block of dominant dims.
 *
 *   int w = keys_block(m, &prof, 8, 0, err);     // the group's top 8 chunks first: w = 8
 *   kv_opts ko = { .n_split = 2 * w, .f16 = 1 };  // the cache keeps dims [0, 2w) as their own block
 *   run_state *s = run_state_new_kv(m, 4096, 64, &ko, err);
 *
 * Keys are cached in the canonical layout (model.h): frequency chunk pairs in the model's chunk
 * order. These functions change that order (m->rope_src, m->rope_freq); attention's results do
 * not change, up to the order of a float sum. `fasa convert` bakes the same order into weights.
 */
#ifndef FASA_KEYS_H
#define FASA_KEYS_H

#include "model.h"
#include "profile.h"

/* Puts every KV head's frequency chunks into canonical positions in the order of the profile's
 * group ranking (RoPE-plane profiles only), so the group's top F chunks become dims [0, 2F) of
 * every cached key: the layout split keys need. Attention's results do not change (up to the
 * order of a float sum). Call after profile_check_model; the model's weights are untouched. */
int keys_order(struct model *m, const profile *p, char *err);
/* The same, but each KV group's keys start with the union of its query heads' own top fcs chunks
 * (then the rest, each in group rank order), so that every head's F chunks lie in one block of
 * the widest union's width. Returns that width in chunks (the most over all layers and groups). */
int keys_order_union(struct model *m, const profile *p, int fcs, char *err);
/* Orders m's key dims for split keys and returns the width of their dominant block in chunks: F
 * (the group's top F chunks), or with per_head the widest union of the group's heads' own top F,
 * rounded up to 4 chunks (8 dims, the TIP kernel's step). 0 when the profile's chunks cannot be
 * ordered or no block narrower than a key holds them (then TIP gathers each head's dims). */
int keys_block(struct model *m, const profile *p, int fcs, int per_head, char *err);

#endif
