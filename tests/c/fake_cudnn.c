/*
 * A recording test double of the part of cuDNN 9's backend API that libh3's attention path
 * (libh3/backend/cuda/cuda_sdpa_cudnn.cpp) calls, built by the tests as libcudnn.so.9 (with an
 * empty libcudnn_graph.so.9 next to it) and loaded through H3_CUDNN_LIB. No GPU, no NVIDIA code:
 * descriptors are plain records of the attributes set on them.
 *
 * What it checks, as cuDNN would refuse it: every cudnnBackendSetAttribute's attribute type and
 * element count against what that attribute takes on that descriptor type (a table below, from
 * cuDNN's cudnn_graph.h documentation); attributes set after finalize; finalize without the
 * required attributes; descriptors of the wrong type where a tensor, an operation, a graph or an
 * engine configuration is expected; a variant pack without a pointer for a graph tensor, or without
 * a workspace when the plan needs one. Each violation is written to the trace as "ERROR ..." and
 * the call fails with cuDNN's status for it.
 *
 * What it records (FAKE_CUDNN_TRACE, a file appended to): at each operation graph's finalize the
 * whole graph, op by op in the order given, each descriptor with its attributes in attribute order
 * and tensors written out in full; the heuristics query; the engine configuration each plan was
 * built from; each execute's variant pack (uid = pointer, by-value scalars by value) and
 * workspace. The trace is the same text whatever order the attributes were set in and whatever
 * the descriptor addresses, so two graph builders can be compared by their traces.
 *
 * Behaviour switches (environment, read at each call):
 *   FAKE_CUDNN_VERSION   cudnnGetVersion's answer (default 91900)
 *   FAKE_CUDNN_ENGINES   the heuristics' answer in order: comma-separated engine global indices,
 *                        each optionally followed by n (numerical note NONDETERMINISTIC) and/or
 *                        f (its execution plan fails to finalize); default "7n,3f,5,9"
 *   FAKE_CUDNN_WORKSPACE bytes each plan needs (default 0)
 *   FAKE_CUDNN_FAIL      the call that fails: create, graph (operation graph finalize), heur
 *                        (no engine configurations), exec, setstream
 *   FAKE_CUDNN_MARK_UID  execute writes 0x5A over the first 16 bytes of this uid's pointer (the
 *                        output, default 4), so a test sees whether an execute reached O
 */
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EXPORT __attribute__((visibility("default")))

/* cuDNN's enum values (cudnn_graph.h), the subset this double understands. */
enum {
    T_HANDLE = 0, T_DATA_TYPE = 1, T_BOOLEAN = 2, T_INT64 = 3, T_FLOAT = 4, T_DOUBLE = 5, T_VOID_PTR = 6,
    T_HEUR_MODE = 8, T_KNOB_TYPE = 9, T_NUMERICAL_NOTE = 11, T_POINTWISE_MODE = 14, T_DESC = 15,
    T_REDUCTION_OP = 18, T_BEHAVIOR_NOTE = 19, T_INT32 = 23, T_CHAR = 24, T_NAN_PROP = 10,
    T_CUDA_GRAPH_RETENTION = 33, T_OPGRAPH_MODE = 32, T_FRACTION = 26,
};
enum {
    D_POINTWISE = 0, D_ENGINE = 2, D_ENGINECFG = 3, D_ENGINEHEUR = 4, D_PLAN = 5, D_KNOB_CHOICE = 7,
    D_OP_POINTWISE = 13, D_OPGRAPH = 15, D_VARIANT_PACK = 16, D_TENSOR = 17, D_MATMUL = 18, D_OP_MATMUL = 19,
    D_REDUCTION = 21, D_OP_REDUCTION = 22, D_OP_RNG = 33, D_OP_SDPA_FWD = 41, D_OP_SOFTMAX = 45,
};
enum {
    S_OK = 0, S_BAD_PARAM = 2000, S_NULL = 2002, S_NOT_FINALIZED = 2004, S_OUT_OF_BOUND = 2005,
    S_ATTR_TYPE = 2010, S_DESC_TYPE = 2012, S_NOT_SUPPORTED = 3000, S_GRAPH_PATTERN = 3001,
    S_INTERNAL = 4000, S_EXEC = 5000,
};
/* Attribute names used below. */
enum {
    A_HEUR_MODE = 200, A_HEUR_GRAPH = 201, A_HEUR_RESULTS = 202, A_HEUR_SM_COUNT = 203, A_HEUR_DEVICEPROP = 204,
    A_CFG_ENGINE = 300, A_CFG_KNOBS = 302, A_CFG_WORKSPACE = 303, A_CFG_SMEM = 304,
    A_PLAN_HANDLE = 400, A_PLAN_CFG = 401, A_PLAN_WORKSPACE = 402, A_PLAN_JSON = 405,
    A_OPGRAPH_HANDLE = 800, A_OPGRAPH_OPS = 801, A_OPGRAPH_ENGINE_COUNT = 802,
    A_TENSOR_ALIGN = 900, A_TENSOR_DTYPE = 901, A_TENSOR_DIMS = 902, A_TENSOR_STRIDES = 903, A_TENSOR_UID = 906,
    A_TENSOR_VIRTUAL = 907, A_TENSOR_BY_VALUE = 908,
    A_VP_UIDS = 1000, A_VP_PTRS = 1001, A_VP_WORKSPACE = 1003,
    A_ENGINE_GRAPH = 1300, A_ENGINE_INDEX = 1301, A_ENGINE_KNOB_INFO = 1302, A_ENGINE_NUMERICAL = 1303,
    A_ENGINE_LAYOUT = 1304, A_ENGINE_BEHAVIOR = 1305,
};
#define NOTE_NONDETERMINISTIC 4

/* ---- what each attribute takes (descriptor type, attribute, element type, min and max count) --
   From cuDNN 9's cudnn_graph.h: the attributes a forward SDPA graph is built from. Anything not
   listed is refused as cuDNN refuses an attribute of another descriptor (BAD_PARAM). */
typedef struct {
    int desc, attr, type;
    int64_t min, max;
    bool required; /* finalize fails without it */
} Spec;

#define MAXN 64
static const Spec SPECS[] = {
    /* tensor */
    {D_TENSOR, 900, T_INT64, 1, 1, true},          /* BYTE_ALIGNMENT */
    {D_TENSOR, 901, T_DATA_TYPE, 1, 1, true},      /* DATA_TYPE */
    {D_TENSOR, 902, T_INT64, 1, 12, true},         /* DIMENSIONS */
    {D_TENSOR, 903, T_INT64, 1, 12, true},         /* STRIDES */
    {D_TENSOR, 904, T_INT64, 1, 1, false},         /* VECTOR_COUNT */
    {D_TENSOR, 905, T_INT64, 1, 1, false},         /* VECTORIZED_DIMENSION */
    {D_TENSOR, 906, T_INT64, 1, 1, true},          /* UNIQUE_ID */
    {D_TENSOR, 907, T_BOOLEAN, 1, 1, false},       /* IS_VIRTUAL */
    {D_TENSOR, 908, T_BOOLEAN, 1, 1, false},       /* IS_BY_VALUE */
    {D_TENSOR, 909, 20, 1, 1, false},              /* REORDERING_MODE */
    /* pointwise descriptor */
    {D_POINTWISE, 0, T_POINTWISE_MODE, 1, 1, true}, /* POINTWISE_MODE */
    {D_POINTWISE, 1, T_DATA_TYPE, 1, 1, true},      /* POINTWISE_MATH_PREC */
    {D_POINTWISE, 2, T_NAN_PROP, 1, 1, false},      /* POINTWISE_NAN_PROPAGATION */
    {D_POINTWISE, 3, T_DOUBLE, 1, 1, false},        /* RELU_LOWER_CLIP */
    {D_POINTWISE, 4, T_DOUBLE, 1, 1, false},        /* RELU_UPPER_CLIP */
    {D_POINTWISE, 5, T_DOUBLE, 1, 1, false},        /* RELU_LOWER_CLIP_SLOPE */
    {D_POINTWISE, 6, T_DOUBLE, 1, 1, false},        /* ELU_ALPHA */
    {D_POINTWISE, 7, T_DOUBLE, 1, 1, false},        /* SOFTPLUS_BETA */
    {D_POINTWISE, 8, T_DOUBLE, 1, 1, false},        /* SWISH_BETA */
    {D_POINTWISE, 9, T_INT64, 1, 1, false},         /* AXIS */
    /* pointwise operation */
    {D_OP_POINTWISE, 750, T_DESC, 1, 1, true},   /* PW_DESCRIPTOR */
    {D_OP_POINTWISE, 751, T_DESC, 1, 1, true},   /* XDESC */
    {D_OP_POINTWISE, 752, T_DESC, 1, 1, false},  /* BDESC */
    {D_OP_POINTWISE, 753, T_DESC, 1, 1, true},   /* YDESC */
    {D_OP_POINTWISE, 754, T_FLOAT, 1, 1, false}, /* ALPHA1 (float or double) */
    {D_OP_POINTWISE, 755, T_FLOAT, 1, 1, false}, /* ALPHA2 */
    {D_OP_POINTWISE, 756, T_DESC, 1, 1, false},  /* DXDESC */
    {D_OP_POINTWISE, 757, T_DESC, 1, 1, false},  /* DYDESC */
    {D_OP_POINTWISE, 758, T_DESC, 1, 1, false},  /* TDESC */
    /* matmul descriptor and operation */
    {D_MATMUL, 1500, T_DATA_TYPE, 1, 1, true},    /* MATMUL_COMP_TYPE */
    {D_OP_MATMUL, 1520, T_DESC, 1, 1, true},      /* ADESC */
    {D_OP_MATMUL, 1521, T_DESC, 1, 1, true},      /* BDESC */
    {D_OP_MATMUL, 1522, T_DESC, 1, 1, true},      /* CDESC */
    {D_OP_MATMUL, 1523, T_DESC, 1, 1, true},      /* DESC */
    {D_OP_MATMUL, 1524, T_INT64, 1, 1, false},    /* IRREGULARLY_STRIDED_BATCH_COUNT */
    {D_OP_MATMUL, 1525, T_DESC, 1, 1, false},     /* GEMM_M_OVERRIDE_DESC */
    {D_OP_MATMUL, 1526, T_DESC, 1, 1, false},     /* GEMM_N_OVERRIDE_DESC */
    {D_OP_MATMUL, 1527, T_DESC, 1, 1, false},     /* GEMM_K_OVERRIDE_DESC */
    /* reduction descriptor and operation */
    {D_REDUCTION, 1600, T_REDUCTION_OP, 1, 1, true}, /* REDUCTION_OPERATOR */
    {D_REDUCTION, 1601, T_DATA_TYPE, 1, 1, true},    /* REDUCTION_COMP_TYPE */
    {D_REDUCTION, 1602, T_BOOLEAN, 1, 1, false},     /* REDUCTION_IS_DETERMINISTIC */
    {D_OP_REDUCTION, 1610, T_DESC, 1, 1, true},      /* XDESC */
    {D_OP_REDUCTION, 1611, T_DESC, 1, 1, true},      /* YDESC */
    {D_OP_REDUCTION, 1612, T_DESC, 1, 1, true},      /* DESC */
    /* the unified SDPA forward operation */
    {D_OP_SDPA_FWD, 2800, T_DESC, 1, 1, true},  /* QDESC */
    {D_OP_SDPA_FWD, 2801, T_DESC, 1, 1, true},  /* KDESC */
    {D_OP_SDPA_FWD, 2802, T_DESC, 1, 1, true},  /* VDESC */
    {D_OP_SDPA_FWD, 2803, T_DESC, 1, 1, true},  /* ODESC */
    {D_OP_SDPA_FWD, 2804, T_DESC, 1, 1, false}, /* STATSDESC */
    {D_OP_SDPA_FWD, 2805, T_DESC, 1, 1, false}, /* SCALEDESC */
    /* operation graph */
    {D_OPGRAPH, 800, T_HANDLE, 1, 1, true},     /* HANDLE */
    {D_OPGRAPH, 801, T_DESC, 1, MAXN, true},    /* OPS */
    {D_OPGRAPH, 803, T_BOOLEAN, 1, 1, false},   /* IS_DYNAMIC_SHAPE_ENABLED */
    {D_OPGRAPH, 805, T_BOOLEAN, 1, 1, false},   /* IS_OVERRIDE_SHAPE_ENABLED */
    {D_OPGRAPH, 806, T_OPGRAPH_MODE, 1, 1, false},
    /* heuristics */
    {D_ENGINEHEUR, 200, T_HEUR_MODE, 1, 1, true},
    {D_ENGINEHEUR, 201, T_DESC, 1, 1, true},
    {D_ENGINEHEUR, 203, T_INT32, 1, 1, false},
    {D_ENGINEHEUR, 204, T_DESC, 1, 1, false},
    /* engine, engine configuration, plan, variant pack */
    {D_ENGINE, 1300, T_DESC, 1, 1, true},
    {D_ENGINE, 1301, T_INT64, 1, 1, true},
    {D_ENGINECFG, 300, T_DESC, 1, 1, true},
    {D_ENGINECFG, 302, T_DESC, 0, MAXN, false},
    {D_PLAN, 400, T_HANDLE, 1, 1, false},
    {D_PLAN, 401, T_DESC, 1, 1, true},
    {D_PLAN, 407, T_DESC, 1, 1, false},
    {D_PLAN, 408, T_CUDA_GRAPH_RETENTION, 1, 1, false},
    {D_VARIANT_PACK, 1000, T_INT64, 0, MAXN, true},
    {D_VARIANT_PACK, 1001, T_VOID_PTR, 0, MAXN, true},
    {D_VARIANT_PACK, 1003, T_VOID_PTR, 1, 1, true},
};

static const Spec *spec_of(int desc, int attr)
{
    for (size_t i = 0; i < sizeof SPECS / sizeof SPECS[0]; i++)
        if (SPECS[i].desc == desc && SPECS[i].attr == attr) return &SPECS[i];
    return NULL;
}

/* Element sizes of the attribute types (C enums are 4 bytes, cuDNN's booleans are C bool). */
static size_t elem_size(int type)
{
    switch (type) {
    case T_BOOLEAN: case T_CHAR: return 1;
    case T_HANDLE: case T_INT64: case T_DOUBLE: case T_VOID_PTR: case T_DESC: return 8;
    case T_FRACTION: return 16;
    default: return 4;
    }
}

/* ---- descriptors ----------------------------------------------------------------------------- */
typedef struct Attr {
    int name, type;
    int64_t count;
    unsigned char *data;
} Attr;

typedef struct Desc {
    uint32_t magic;
    int type;
    bool finalized;
    int nattr;
    Attr attr[24];
    /* engine configurations a finalized heuristics holds; the engine's fail flag */
    struct Desc *results[16];
    int nresults;
    bool plan_fails;
} Desc;

#define MAGIC 0xC0DE5DA5u

static Desc *as_desc(void *p) { return p && ((Desc *)p)->magic == MAGIC ? (Desc *)p : NULL; }

static FILE *trace_file(void)
{
    const char *p = getenv("FAKE_CUDNN_TRACE");
    if (!p || !*p) return NULL;
    return fopen(p, "a");
}

static void tracef(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void tracef(const char *fmt, ...)
{
    FILE *f = trace_file();
    if (!f) return;
    va_list ap;
    va_start(ap, fmt);
    vfprintf(f, fmt, ap);
    va_end(ap);
    fclose(f);
}

static int fail_is(const char *what)
{
    const char *f = getenv("FAKE_CUDNN_FAIL");
    return f && strcmp(f, what) == 0;
}

static Attr *find(Desc *d, int name)
{
    for (int i = 0; i < d->nattr; i++)
        if (d->attr[i].name == name) return &d->attr[i];
    return NULL;
}

static void put(Desc *d, int name, int type, int64_t count, const void *src)
{
    Attr *a = find(d, name);
    if (!a) {
        a = &d->attr[d->nattr++];
        a->name = name;
        a->data = NULL;
    }
    free(a->data);
    a->type = type;
    a->count = count;
    size_t bytes = elem_size(type) * (size_t)count;
    a->data = malloc(bytes ? bytes : 1);
    if (bytes) memcpy(a->data, src, bytes);
}

static int64_t get_i64(Desc *d, int name, int64_t dflt)
{
    Attr *a = find(d, name);
    if (!a || a->count < 1) return dflt;
    if (a->type == T_INT64) { int64_t v; memcpy(&v, a->data, 8); return v; }
    if (a->type == T_BOOLEAN) return a->data[0];
    int32_t v;
    memcpy(&v, a->data, 4);
    return v;
}

static Desc *get_desc(Desc *d, int name, int64_t i)
{
    Attr *a = find(d, name);
    if (!a || a->type != T_DESC || i >= a->count) return NULL;
    void *p;
    memcpy(&p, a->data + 8 * i, 8);
    return as_desc(p);
}

EXPORT int cudnnBackendCreateDescriptor(int type, void **out)
{
    if (!out) return S_NULL;
    Desc *d = calloc(1, sizeof *d);
    if (!d) return S_INTERNAL;
    d->magic = MAGIC;
    d->type = type;
    *out = d;
    return S_OK;
}

EXPORT int cudnnBackendDestroyDescriptor(void *p)
{
    Desc *d = as_desc(p);
    if (!d) return S_BAD_PARAM;
    for (int i = 0; i < d->nattr; i++) free(d->attr[i].data);
    d->magic = 0;
    free(d);
    return S_OK;
}

static void keep(Desc *d);

/* A snapshot of `d`, freed when the library is unloaded. */
static Desc *clone(const Desc *d)
{
    Desc *c = malloc(sizeof *c);
    if (!c) return NULL;
    *c = *d;
    for (int i = 0; i < c->nattr; i++) {
        size_t bytes = elem_size(d->attr[i].type) * (size_t)d->attr[i].count;
        c->attr[i].data = malloc(bytes ? bytes : 1);
        if (!c->attr[i].data) abort();
        if (bytes) memcpy(c->attr[i].data, d->attr[i].data, bytes);
    }
    keep(c);
    return c;
}

EXPORT int cudnnBackendSetAttribute(void *p, int name, int type, int64_t count, const void *src)
{
    Desc *d = as_desc(p);
    if (!d) { tracef("ERROR set %d on a non-descriptor\n", name); return S_BAD_PARAM; }
    if (d->finalized) { tracef("ERROR set %d on finalized descriptor type %d\n", name, d->type); return S_BAD_PARAM; }
    const Spec *s = spec_of(d->type, name);
    if (!s && getenv("FAKE_CUDNN_LENIENT")) {
        tracef("lenient: attribute %d type %d count %lld on descriptor type %d\n", name, type, (long long)count, d->type);
        put(d, name, type, count, src);
        return S_OK;
    }
    if (!s) {
        tracef("ERROR attribute %d does not belong to descriptor type %d\n", name, d->type);
        return S_BAD_PARAM;
    }
    /* ALPHA1/ALPHA2 take float or double. */
    bool type_ok = type == s->type || ((name == 754 || name == 755) && type == T_DOUBLE);
    if (!type_ok) {
        tracef("ERROR attribute %d of descriptor type %d: type %d, expected %d\n", name, d->type, type, s->type);
        return S_ATTR_TYPE;
    }
    if (count < s->min || count > s->max) {
        tracef("ERROR attribute %d of descriptor type %d: %lld elements, expected %lld..%lld\n", name, d->type,
               (long long)count, (long long)s->min, (long long)s->max);
        return S_BAD_PARAM;
    }
    if (count > 0 && !src) return S_NULL;
    if (type == T_DESC) {
        for (int64_t i = 0; i < count; i++) {
            void *q;
            memcpy(&q, (const unsigned char *)src + 8 * i, 8);
            Desc *e = as_desc(q);
            if (!e) { tracef("ERROR attribute %d: element %lld is not a descriptor\n", name, (long long)i); return S_BAD_PARAM; }
            /* a descriptor must be finalized before it is referenced (cuDNN's NOT_FINALIZED) */
            if (!e->finalized && name != A_CFG_KNOBS) {
                tracef("ERROR attribute %d of descriptor type %d: references unfinalized type %d\n", name, d->type, e->type);
                return S_NOT_FINALIZED;
            }
        }
    }
    put(d, name, type, count, src);
    /* cuDNN copies what a descriptor references (the caller may destroy a pointwise or matmul
       descriptor once its operation is finalized): keep a snapshot */
    if (type == T_DESC) {
        Attr *a = find(d, name);
        for (int64_t i = 0; i < count; i++) {
            void *q;
            memcpy(&q, a->data + 8 * i, 8);
            Desc *c = clone(as_desc(q));
            if (!c) return S_INTERNAL;
            memcpy(a->data + 8 * i, &c, 8);
        }
    }
    return S_OK;
}

/* ---- the trace's canonical text ------------------------------------------------------------- */
static void print_desc(FILE *f, Desc *d, int depth);

static void print_values(FILE *f, Attr *a, int depth)
{
    for (int64_t i = 0; i < a->count; i++) {
        const unsigned char *e = a->data + elem_size(a->type) * (size_t)i;
        if (i) fputc(',', f);
        switch (a->type) {
        case T_INT64: { int64_t v; memcpy(&v, e, 8); fprintf(f, "%lld", (long long)v); break; }
        case T_FLOAT: { float v; memcpy(&v, e, 4); fprintf(f, "%.9g", (double)v); break; }
        case T_DOUBLE: { double v; memcpy(&v, e, 8); fprintf(f, "d%.17g", v); break; }
        case T_BOOLEAN: fprintf(f, "%s", e[0] ? "true" : "false"); break;
        case T_HANDLE: fprintf(f, "handle"); break;
        case T_VOID_PTR: { void *v; memcpy(&v, e, 8); fprintf(f, "%p", v); break; }
        case T_DESC: { void *v; memcpy(&v, e, 8); print_desc(f, as_desc(v), depth + 1); break; }
        default: { int32_t v; memcpy(&v, e, 4); fprintf(f, "%d", v); break; }
        }
    }
}

static void print_desc(FILE *f, Desc *d, int depth)
{
    if (!d) { fprintf(f, "?"); return; }
    fprintf(f, "%s%d{", d->type == D_TENSOR ? "T" : "D", d->type);
    /* attributes in name order */
    int order[24], n = d->nattr;
    for (int i = 0; i < n; i++) order[i] = i;
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && d->attr[order[j]].name < d->attr[order[j - 1]].name; j--) {
            int t = order[j]; order[j] = order[j - 1]; order[j - 1] = t;
        }
    for (int i = 0; i < n; i++) {
        Attr *a = &d->attr[order[i]];
        if (a->name == A_OPGRAPH_HANDLE) continue;
        fprintf(f, "%s%d:%d=", i ? " " : "", a->name, a->type);
        print_values(f, a, depth);
    }
    fputc('}', f);
}

/* A descriptor's attributes other than `skip`, in the order set (for the one-line records). */
static void print_other_attrs(FILE *f, Desc *d, int skip)
{
    for (int k = 0; k < d->nattr; k++) {
        if (d->attr[k].name == skip) continue;
        fprintf(f, " %d:%d=", d->attr[k].name, d->attr[k].type);
        print_values(f, &d->attr[k], 0);
    }
}

/* Every tensor an operation references, for the variant-pack check. */
static int graph_tensors(Desc *g, Desc **out, int cap)
{
    int n = 0;
    Attr *ops = find(g, A_OPGRAPH_OPS);
    for (int64_t i = 0; ops && i < ops->count; i++) {
        Desc *op = get_desc(g, A_OPGRAPH_OPS, i);
        if (!op) continue;
        for (int k = 0; k < op->nattr; k++) {
            if (op->attr[k].type != T_DESC) continue;
            for (int64_t j = 0; j < op->attr[k].count; j++) {
                void *v;
                memcpy(&v, op->attr[k].data + 8 * j, 8);
                Desc *t = as_desc(v);
                if (!t || t->type != D_TENSOR) continue;
                bool seen = false;
                for (int m = 0; m < n; m++) seen |= out[m] == t || get_i64(out[m], A_TENSOR_UID, -1) == get_i64(t, A_TENSOR_UID, -2);
                if (!seen && n < cap) out[n++] = t;
            }
        }
    }
    return n;
}

static int missing(Desc *d)
{
    for (size_t i = 0; i < sizeof SPECS / sizeof SPECS[0]; i++)
        if (SPECS[i].desc == d->type && SPECS[i].required && !find(d, SPECS[i].attr)) return SPECS[i].attr;
    return -1;
}

/* Engines and configurations the heuristics made outlive it (the caller's copies refer to them):
   freed when the library is unloaded. */
static Desc **kept;
static size_t nkept, capkept;
static void keep(Desc *d)
{
    if (nkept == capkept) {
        capkept = capkept ? 2 * capkept : 64;
        kept = realloc(kept, capkept * sizeof *kept);
        if (!kept) abort();
    }
    kept[nkept++] = d;
}
__attribute__((destructor)) static void free_kept(void)
{
    for (size_t i = 0; i < nkept; i++) cudnnBackendDestroyDescriptor(kept[i]);
    free(kept);
}

/* The engines FAKE_CUDNN_ENGINES lists. */
static int engines(int64_t *idx, bool *nondet, bool *fails, int cap)
{
    const char *s = getenv("FAKE_CUDNN_ENGINES");
    if (!s) s = "7n,3f,5,9";
    int n = 0;
    while (*s && n < cap) {
        char *end;
        idx[n] = strtoll(s, &end, 10);
        if (end == s) break;
        nondet[n] = fails[n] = false;
        for (s = end; *s && *s != ','; s++) {
            if (*s == 'n') nondet[n] = true;
            if (*s == 'f') fails[n] = true;
        }
        if (*s == ',') s++;
        n++;
    }
    return n;
}

EXPORT int cudnnBackendFinalize(void *p)
{
    Desc *d = as_desc(p);
    if (!d) return S_BAD_PARAM;
    if (d->finalized) { tracef("ERROR finalize twice, type %d\n", d->type); return S_BAD_PARAM; }
    int m = missing(d);
    if (m >= 0) { tracef("ERROR finalize type %d without attribute %d\n", d->type, m); return S_BAD_PARAM; }
    FILE *f;
    switch (d->type) {
    case D_TENSOR: {
        Attr *dims = find(d, A_TENSOR_DIMS), *strides = find(d, A_TENSOR_STRIDES);
        if (dims->count != strides->count) { tracef("ERROR tensor with %lld dims and %lld strides\n", (long long)dims->count, (long long)strides->count); return S_BAD_PARAM; }
        break;
    }
    case D_OPGRAPH:
        for (int64_t i = 0; i < find(d, A_OPGRAPH_OPS)->count; i++) {
            Desc *op = get_desc(d, A_OPGRAPH_OPS, i);
            if (!op || op->type == D_TENSOR || op->type < D_OP_POINTWISE) { tracef("ERROR graph op %lld is not an operation\n", (long long)i); return S_BAD_PARAM; }
        }
        if ((f = trace_file())) {
            Attr *ops = find(d, A_OPGRAPH_OPS);
            fprintf(f, "graph %lld ops\n", (long long)ops->count);
            for (int64_t i = 0; i < ops->count; i++) {
                fprintf(f, "  op ");
                print_desc(f, get_desc(d, A_OPGRAPH_OPS, i), 0);
                fputc('\n', f);
            }
            fprintf(f, "  graph-attrs");
            print_other_attrs(f, d, A_OPGRAPH_OPS);
            fputc('\n', f);
            fclose(f);
        }
        if (fail_is("graph")) return S_GRAPH_PATTERN;
        break;
    case D_ENGINEHEUR: {
        Desc *g = get_desc(d, A_HEUR_GRAPH, 0);
        if (!g || g->type != D_OPGRAPH) { tracef("ERROR heuristics without an operation graph\n"); return S_BAD_PARAM; }
        if ((f = trace_file())) {
            fprintf(f, "heuristics");
            print_other_attrs(f, d, A_HEUR_GRAPH);
            fputc('\n', f);
            fclose(f);
        }
        if (fail_is("heur")) break;
        int64_t idx[16];
        bool nd[16], fl[16];
        int n = engines(idx, nd, fl, 16);
        for (int i = 0; i < n; i++) {
            void *e, *c;
            cudnnBackendCreateDescriptor(D_ENGINE, &e);
            Desc *en = e;
            put(en, A_ENGINE_GRAPH, T_DESC, 1, &g);
            put(en, A_ENGINE_INDEX, T_INT64, 1, &idx[i]);
            int32_t notes[2] = {0 /* TENSOR_CORE */, NOTE_NONDETERMINISTIC};
            put(en, A_ENGINE_NUMERICAL, T_NUMERICAL_NOTE, nd[i] ? 2 : 1, notes);
            put(en, A_ENGINE_BEHAVIOR, T_BEHAVIOR_NOTE, 0, notes);
            en->plan_fails = fl[i];
            en->finalized = true;
            cudnnBackendCreateDescriptor(D_ENGINECFG, &c);
            Desc *cf = c;
            put(cf, A_CFG_ENGINE, T_DESC, 1, &e);
            put(cf, A_CFG_KNOBS, T_DESC, 0, NULL);
            const char *w = getenv("FAKE_CUDNN_WORKSPACE");
            int64_t ws = w ? strtoll(w, NULL, 10) : 0;
            int32_t smem = 101376;
            put(cf, A_CFG_WORKSPACE, T_INT64, 1, &ws);
            put(cf, A_CFG_SMEM, T_INT32, 1, &smem);
            cf->finalized = true;
            keep(en);
            keep(cf);
            d->results[d->nresults++] = cf;
        }
        break;
    }
    case D_ENGINE: {
        /* an engine the caller made from a global index */
        Desc *g = get_desc(d, A_ENGINE_GRAPH, 0);
        if (!g || g->type != D_OPGRAPH) return S_BAD_PARAM;
        break;
    }
    case D_ENGINECFG: {
        Desc *e = get_desc(d, A_CFG_ENGINE, 0);
        if (!e || e->type != D_ENGINE) { tracef("ERROR engine configuration without an engine\n"); return S_BAD_PARAM; }
        break;
    }
    case D_PLAN: {
        Desc *c = get_desc(d, A_PLAN_CFG, 0);
        if (!c || c->type != D_ENGINECFG) { tracef("ERROR plan without an engine configuration\n"); return S_BAD_PARAM; }
        Desc *e = get_desc(c, A_CFG_ENGINE, 0);
        int64_t idx = e ? get_i64(e, A_ENGINE_INDEX, -1) : -1;
        bool fails = e && e->plan_fails;
        if ((f = trace_file())) {
            fprintf(f, "plan engine %lld%s", (long long)idx, fails ? " fails" : "");
            print_other_attrs(f, d, A_PLAN_CFG);
            fputc('\n', f);
            fclose(f);
        }
        if (fails) return S_NOT_SUPPORTED;
        const char *w = getenv("FAKE_CUDNN_WORKSPACE");
        int64_t ws = w ? strtoll(w, NULL, 10) : 0;
        put(d, A_PLAN_WORKSPACE, T_INT64, 1, &ws);
        /* the graph, for the execute's checks */
        if (e) {
            Desc *g = get_desc(e, A_ENGINE_GRAPH, 0);
            put(d, 99999, T_DESC, 1, &g);
        }
        break;
    }
    default: break;
    }
    d->finalized = true;
    return S_OK;
}

/* Copy `src`'s record into the caller's descriptor `dst` (how cuDNN hands out descriptors). */
static int copy_into(Desc *dst, Desc *src)
{
    if (!dst) return S_BAD_PARAM;
    if (dst->type != src->type) { tracef("ERROR get into descriptor type %d, expected %d\n", dst->type, src->type); return S_DESC_TYPE; }
    for (int i = 0; i < src->nattr; i++) put(dst, src->attr[i].name, src->attr[i].type, src->attr[i].count, src->attr[i].data);
    dst->plan_fails = src->plan_fails;
    dst->finalized = true;
    return S_OK;
}

EXPORT int cudnnBackendGetAttribute(void *const p, int name, int type, int64_t requested, int64_t *count, void *out)
{
    Desc *d = as_desc(p);
    if (!d) return S_BAD_PARAM;
    if (!d->finalized) { tracef("ERROR get %d from unfinalized type %d\n", name, d->type); return S_NOT_FINALIZED; }
    if (d->type == D_ENGINEHEUR && name == A_HEUR_RESULTS) {
        if (type != T_DESC) return S_ATTR_TYPE;
        if (count) *count = d->nresults;
        for (int64_t i = 0; i < requested && i < d->nresults && out; i++) {
            void *q;
            memcpy(&q, (unsigned char *)out + 8 * i, 8);
            int rc = copy_into(as_desc(q), d->results[i]);
            if (rc) return rc;
            /* the engine is copied by reference into the caller's configuration: give it its own */
        }
        return S_OK;
    }
    Attr *a = find(d, name);
    if (!a) {
        tracef("note: get of unset attribute %d from type %d\n", name, d->type);
        if (count) *count = 0;
        return S_BAD_PARAM;
    }
    if (a->type != type) { tracef("ERROR get %d as type %d, stored as %d\n", name, type, a->type); return S_ATTR_TYPE; }
    if (count) *count = a->count;
    if (type == T_DESC) {
        for (int64_t i = 0; i < requested && i < a->count && out; i++) {
            void *q, *s;
            memcpy(&q, (unsigned char *)out + 8 * i, 8);
            memcpy(&s, a->data + 8 * i, 8);
            int rc = copy_into(as_desc(q), as_desc(s));
            if (rc) return rc;
        }
        return S_OK;
    }
    int64_t n = requested < a->count ? requested : a->count;
    if (n > 0 && out) memcpy(out, a->data, elem_size(type) * (size_t)n);
    return S_OK;
}

/* ---- handle, execute ------------------------------------------------------------------------ */
typedef struct {
    uint32_t magic;
    void *stream;
} Handle;

EXPORT size_t cudnnGetVersion(void)
{
    const char *v = getenv("FAKE_CUDNN_VERSION");
    return v ? (size_t)strtoull(v, NULL, 10) : 91900;
}
EXPORT size_t cudnnGetCudartVersion(void) { return 13000; }
EXPORT size_t cudnnGetMaxDeviceVersion(void) { return 1210; }

EXPORT int cudnnCreate(Handle **h)
{
    if (!h) return S_NULL;
    if (fail_is("create")) return 3007; /* NOT_SUPPORTED_ARCH_MISMATCH */
    *h = calloc(1, sizeof **h);
    if (!*h) return S_INTERNAL;
    (*h)->magic = 0x4A4D;
    tracef("create handle\n");
    return S_OK;
}
EXPORT int cudnnDestroy(Handle *h)
{
    free(h);
    return S_OK;
}
EXPORT int cudnnSetStream(Handle *h, void *s)
{
    if (!h || h->magic != 0x4A4D) return S_BAD_PARAM;
    if (fail_is("setstream")) return S_BAD_PARAM;
    h->stream = s;
    return S_OK;
}
EXPORT int cudnnGetStream(Handle *h, void **s)
{
    if (!h || !s) return S_BAD_PARAM;
    *s = h->stream;
    return S_OK;
}
EXPORT const char *cudnnGetErrorString(int s)
{
    switch (s) {
    case S_OK: return "CUDNN_STATUS_SUCCESS";
    case S_BAD_PARAM: return "CUDNN_STATUS_BAD_PARAM";
    case S_NOT_SUPPORTED: return "CUDNN_STATUS_NOT_SUPPORTED";
    case S_GRAPH_PATTERN: return "CUDNN_STATUS_NOT_SUPPORTED_GRAPH_PATTERN";
    case 3007: return "CUDNN_STATUS_NOT_SUPPORTED_ARCH_MISMATCH";
    case S_EXEC: return "CUDNN_STATUS_EXECUTION_FAILED";
    default: return "CUDNN_STATUS_UNKNOWN (fake)";
    }
}
EXPORT void cudnnGetLastErrorString(char *m, size_t n)
{
    if (m && n) snprintf(m, n, "fake cuDNN: no detail");
}

EXPORT int cudnnBackendExecute(Handle *h, void *plan, void *pack)
{
    Desc *pl = as_desc(plan), *vp = as_desc(pack);
    if (!h || h->magic != 0x4A4D) return S_BAD_PARAM;
    if (!pl || pl->type != D_PLAN || !pl->finalized || !vp || vp->type != D_VARIANT_PACK || !vp->finalized) {
        tracef("ERROR execute without a finalized plan and variant pack\n");
        return S_BAD_PARAM;
    }
    Attr *uids = find(vp, A_VP_UIDS), *ptrs = find(vp, A_VP_PTRS);
    if (uids->count != ptrs->count) { tracef("ERROR variant pack: %lld uids, %lld pointers\n", (long long)uids->count, (long long)ptrs->count); return S_BAD_PARAM; }
    void *ws;
    memcpy(&ws, find(vp, A_VP_WORKSPACE)->data, 8);
    int64_t need = get_i64(pl, A_PLAN_WORKSPACE, 0);
    if (need > 0 && !ws) { tracef("ERROR execute without the workspace the plan needs\n"); return S_BAD_PARAM; }
    Desc *g = get_desc(pl, 99999, 0);
    Desc *ts[64];
    int nt = g ? graph_tensors(g, ts, 64) : 0;
    /* in uid order, whatever order the pack lists them in */
    for (int i = 1; i < nt; i++)
        for (int j = i; j > 0 && get_i64(ts[j], A_TENSOR_UID, 0) < get_i64(ts[j - 1], A_TENSOR_UID, 0); j--) {
            Desc *t = ts[j]; ts[j] = ts[j - 1]; ts[j - 1] = t;
        }
    FILE *f = trace_file();
    if (f) fprintf(f, "execute stream %p workspace %s", h->stream, ws ? "yes" : "no");
    for (int i = 0; i < nt; i++) {
        if (get_i64(ts[i], A_TENSOR_VIRTUAL, 0)) continue;
        int64_t uid = get_i64(ts[i], A_TENSOR_UID, -1);
        int64_t k;
        for (k = 0; k < uids->count; k++) {
            int64_t u;
            memcpy(&u, uids->data + 8 * k, 8);
            if (u == uid) break;
        }
        if (k == uids->count) {
            if (f) { fprintf(f, "\nERROR variant pack has no pointer for uid %lld\n", (long long)uid); fclose(f); }
            return S_BAD_PARAM;
        }
        void *ptr;
        memcpy(&ptr, ptrs->data + 8 * k, 8);
        if (!ptr) { if (f) { fprintf(f, "\nERROR null pointer for uid %lld\n", (long long)uid); fclose(f); } return S_NULL; }
        if (f) {
            if (get_i64(ts[i], A_TENSOR_BY_VALUE, 0)) {
                int64_t dt = get_i64(ts[i], A_TENSOR_DTYPE, -1);
                if (dt == 0) { float v; memcpy(&v, ptr, 4); fprintf(f, " %lld=float:%.9g", (long long)uid, (double)v); }
                else if (dt == 4) { int32_t v; memcpy(&v, ptr, 4); fprintf(f, " %lld=int32:%d", (long long)uid, v); }
                else if (dt == 10) { int64_t v; memcpy(&v, ptr, 8); fprintf(f, " %lld=int64:%lld", (long long)uid, (long long)v); }
                else fprintf(f, " %lld=dtype%lld:?", (long long)uid, (long long)dt);
            } else {
                fprintf(f, " %lld=%p", (long long)uid, ptr);
            }
        }
    }
    if (f) { fputc('\n', f); fclose(f); }
    if (fail_is("exec")) return S_EXEC;
    const char *mu = getenv("FAKE_CUDNN_MARK_UID");
    int64_t mark = mu ? strtoll(mu, NULL, 10) : 4;
    for (int64_t k = 0; k < uids->count; k++) {
        int64_t u;
        memcpy(&u, uids->data + 8 * k, 8);
        if (u != mark) continue;
        void *ptr;
        memcpy(&ptr, ptrs->data + 8 * k, 8);
        if (ptr) memset(ptr, 0x5A, 16);
    }
    return S_OK;
}
