/* keys.c - the order of each KV head's key dims in the cache (keys.h). No weights change: the
 * model's RoPE tables say which file dims and which frequency each canonical pair takes. */
#include "keys.h"

#include <string.h>

int keys_order_union(model *m, const profile *p, int fcs, char *err)
{
    const int d = m->cfg.d_head, half = d / 2, group = m->cfg.n_head / m->cfg.n_kv_head;
    if (p->chunks != CHUNKS_PLANE)
        return fasa_error(err, FASA_EARG,
                          "only a profile of RoPE-plane chunks can order the key cache (this one has adjacent chunks)");
    int16_t dims[1024], src[1024], ord[512];
    float freq[512];
    int widest = 0;
    for (int l = 0; l < m->cfg.n_layer; l++)
        for (int g = 0; g < m->cfg.n_kv_head; g++) {
            profile_chunk_dims(m, l, g, CHUNKS_PLANE, dims);
            const int16_t *r = profile_group_rank(p, l, g);
            /* the union of the group's heads' top fcs chunks first, then the rest, each in group
             * rank order (fcs 0: the group rank as it is) */
            uint8_t in[512] = { 0 };
            for (int h = g * group; h < (g + 1) * group; h++)
                for (int j = 0; j < fcs && j < half; j++) in[profile_rank(p, l, h)[j]] = 1;
            int n = 0;
            for (int pass = 1; pass >= 0; pass--)
                for (int j = 0; j < half; j++)
                    if (in[r[j]] == pass) ord[n++] = r[j];
            int u = 0;
            for (int j = 0; j < half; j++) u += in[j];
            widest = u > widest ? u : widest;
            int16_t *ms = m->rope_src + ((size_t)l * m->cfg.n_kv_head + g) * d;
            float *mf = m->rope_freq + ((size_t)l * m->cfg.n_kv_head + g) * half;
            for (int j = 0; j < half; j++) {
                const int pair = dims[2 * ord[j]] / 2;   /* a plane chunk is one canonical pair */
                src[2 * j] = ms[dims[2 * ord[j]]], src[2 * j + 1] = ms[dims[2 * ord[j] + 1]];
                freq[j] = mf[pair];
            }
            memcpy(ms, src, sizeof(int16_t) * d);
            memcpy(mf, freq, sizeof(float) * half);
        }
    return widest;
}

int keys_block(model *m, const profile *p, int fcs, int per_head, char *err)
{
    const int half = m->cfg.d_head / 2;
    if (p->chunks != CHUNKS_PLANE || fcs < 1 || fcs >= half) return 0;
    const int widest = keys_order_union(m, p, per_head ? fcs : 0, err);
    if (widest < 0) return widest;
    const int w = per_head ? (widest + 3) / 4 * 4 : fcs;
    return w < half ? w : 0;
}

int keys_order(model *m, const profile *p, char *err)
{
    const int rc = keys_order_union(m, p, 0, err);
    return rc < 0 ? rc : 0;
}
