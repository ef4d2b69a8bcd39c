/* Shared by cuda_attention.cpp and kernels/attention.cu: the kernels' argument structs and constants. */
#ifndef H3K_ATTENTION_H
#define H3K_ATTENTION_H

namespace h3cuda {


struct AttnArgs {
    const bf16_t *q, *k, *v;
    void *o;
    int64_t ldq, ldk, ldv, ldo;
    int Lq, Lk, group, D, off; /* off = Lk - Lq (causal) */
    float sl2;                 /* scale * log2(e) */
    int o_pairs;               /* two adjacent outputs may be stored as one 4/8-byte word */
};

} /* namespace h3cuda */

#endif
