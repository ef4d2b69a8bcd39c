/*
 * A PDD LoRA's per-step output heads (lora.h): built by h3_dit_prepare for every step of the prepared
 * grids, used by the forward's final layer in place of the checkpoint's heads, dropped with the schedule.
 */
#include "models/dit_internal.h"

void dit_pdd_drop(h3_dit *d)
{
    for (int m = 0; m < 2; m++) {
        for (int s = 0; s < d->sc.pdd_n; s++) {
            if (d->sc.pdd_w[m]) dit_wfree(d, &d->sc.pdd_w[m][s]);
            if (d->sc.pdd_b[m]) dit_bfree(d, d->sc.pdd_b[m][s]);
            if (d->sc.pdd_host[m]) h3_free_aligned(d->sc.pdd_host[m][s]);
        }
        free(d->sc.pdd_w[m]);
        free(d->sc.pdd_b[m]);
        free(d->sc.pdd_host[m]);
        d->sc.pdd_w[m] = NULL;
        d->sc.pdd_b[m] = NULL;
        d->sc.pdd_host[m] = NULL;
    }
    d->sc.pdd_n = 0;
}

/* The PDD heads of every step of the prepared grids: each step's weighted mean of the bank's
   interval heads (lora.h), made a backend weight. The host copies stay: a CPU weight may be a
   view of them. */
int dit_pdd_build(h3_dit *d, int evals)
{
    const int64_t H = d->w.c.hidden, rows[2] = {d->w.P, d->w.c.audio_ch};
    int rc = 0;
    for (int m = 0; m < 2 && !rc; m++) {
        d->sc.pdd_w[m] = h3_calloc((size_t)evals, sizeof **d->sc.pdd_w);
        d->sc.pdd_b[m] = h3_calloc((size_t)evals, sizeof **d->sc.pdd_b);
        d->sc.pdd_host[m] = h3_calloc((size_t)evals, sizeof **d->sc.pdd_host);
        if (!d->sc.pdd_w[m] || !d->sc.pdd_b[m] || !d->sc.pdd_host[m]) rc = -H3_E_NOMEM;
    }
    if (!rc) d->sc.pdd_n = evals;
    for (int s = 0; s < evals && !rc; s++)
        for (int m = 0; m < 2 && !rc; m++) {
            float *host = h3_alloc_aligned(sizeof(float) * (size_t)(rows[m] * H + rows[m]));
            if (!host) {
                rc = -H3_E_NOMEM;
                break;
            }
            d->sc.pdd_host[m][s] = host;
            rc = h3_lora_pdd_head(d->w.lora, m, d->sc.sig[m][s], d->sc.sig[m][s + 1], host, host + rows[m] * H);
            if (!rc) rc = d->be->weights->weight_load(d->be, host, H3_DT_F32, rows[m], H, &d->sc.pdd_w[m][s]);
            if (!rc &&
                !(d->sc.pdd_b[m][s] = h3_backend_dup(d->be, host + rows[m] * H, sizeof(float) * (size_t)rows[m])))
                rc = -H3_E_NOMEM;
        }
    return rc;
}
