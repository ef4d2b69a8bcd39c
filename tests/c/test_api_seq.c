/*
 * Stateful API test: random sequences of public C calls on live contexts, valid and invalid
 * arguments mixed, in any order. Every call must either succeed or return a negative H3_E* code
 * with a non-empty h3_last_error(); where the context's state decides the outcome (a step before a
 * prepare, a decode before the last step, a step after h3_dit_denoise replaced the prepared
 * request's transformer state, a progress hook that cancels) the exact code is checked. Buffers
 * are allocated exactly as large as h3.h documents, so under ASan any overrun is caught.
 *
 * The model is a complete checkpoint in the official layout written here with the smallest
 * dimensions every component accepts (hidden sizes of 4-8, one layer each, 8x8-pixel canvases,
 * 4 audio latents per second), so ten thousand sequences run in seconds even under ASan+UBSan.
 *
 *   test_api_seq [SEED [SEQUENCES]]     (defaults: fixed seed, 10000 sequences; the environment
 *                                         variables H3_API_SEQ_SEED / H3_API_SEQ_COUNT also work)
 *
 * H3_API_SEQ_PROFILE=1 prints the time spent per kind of call (the test must stay fast under ASan);
 * H3_API_SEQ_DEVICE=metal opens the contexts on the Metal backend instead of the CPU;
 * H3_API_SEQ_KEEP=1 keeps the model directory it writes and prints its path.
 *
 * A failure prints the seed, the sequence number and the calls of that sequence; the run is
 * deterministic for a seed, so the same command reproduces it.
 */
#include "ctest.h"
#include "core/internal.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "api_seq_model.inc" /* the micro model folder the sequences open */

/* ---- randomness, tracing, expectations ------------------------------------------------------- */

static uint64_t g_rs;
static uint64_t rnd(void)
{
    g_rs ^= g_rs << 13;
    g_rs ^= g_rs >> 7;
    g_rs ^= g_rs << 17;
    return g_rs * 0x2545F4914F6CDD1Dull;
}
static int rint_(int n) { return (int)(rnd() % (uint64_t)n); }
static bool chance(int percent) { return rint_(100) < percent; }

static unsigned long long g_seed;
static long g_seq;           /* current sequence number */
static char g_trace[64][200]; /* the calls of the current sequence */
static int g_ntrace;
static bool g_dumped;

static void trace(const char *fmt, ...) H3_PRINTF(1, 2);
static void trace(const char *fmt, ...)
{
    if (g_ntrace == 64) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_trace[g_ntrace++], sizeof g_trace[0], fmt, ap);
    va_end(ap);
}

/* A failed expectation prints the sequence's calls once, so a failure can be replayed by reading them. */
#define EXPECT(cond, ...)                                                                              \
    do {                                                                                               \
        CHECK_MSG(cond, __VA_ARGS__);                                                                  \
        if (!(cond) && !g_dumped) {                                                                    \
            g_dumped = true;                                                                           \
            fprintf(stderr, "  seed %llu, sequence %ld; its calls so far:\n", g_seed, g_seq);          \
            for (int i_ = 0; i_ < g_ntrace; i_++) fprintf(stderr, "    %s\n", g_trace[i_]);           \
        }                                                                                              \
    } while (0)

/* The contract every call keeps: success, or a negative H3_E* code with a message. */
static void contract(const char *what, long long rc)
{
    trace("  -> %lld%s%s", rc, rc < 0 ? ": " : "", rc < 0 ? h3_last_error() : "");
    if (rc < 0) {
        EXPECT(rc >= -H3_E_UNSUPPORTED, "%s returned %lld, not an H3_E* code", what, rc);
        EXPECT(h3_last_error()[0] != 0, "%s failed (%lld) without a message", what, rc);
    }
}

static void contract_ptr(const char *what, const void *p)
{
    trace("  -> %s%s", p ? "ok" : "NULL: ", p ? "" : h3_last_error());
    if (!p) EXPECT(h3_last_error()[0] != 0, "%s returned NULL without a message", what);
}

/* Strings the API returns as JSON must parse (with libh3's own strict reader) to an object. */
static void expect_json(const char *what, const char *s)
{
    if (!s) return;
    h3_json doc;
    int rc = h3_json_parse(&doc, s, strlen(s));
    EXPECT(rc == 0 && h3j_root(&doc)->type == H3J_OBJ, "%s is not a JSON object: %.200s", what, s);
    if (rc == 0) h3_json_free(&doc);
    h3_err_clear();
}

/* malloc of exactly n elements (at least one byte, so a zero-size buffer is still a distinct
   pointer ASan guards). */
static void *xalloc(size_t n, size_t elem)
{
    size_t bytes = n * elem;
    void *p = malloc(bytes ? bytes : 1);
    if (!p) abort();
    return p;
}

static bool all_finite(const float *x, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(x[i])) return false;
    return true;
}

/* ---- progress ------------------------------------------------------------------------------ */

typedef struct {
    int countdown; /* > 0: cancel at that call */
    long calls, cancels, bad;
    char bad_what[160];
} prog;

static prog g_prog;

static int on_progress(void *user, const char *phase, int done, int total)
{
    prog *p = user;
    p->calls++;
    if (!phase || !phase[0] || done < 0 || total < 1 || done > total) {
        if (!p->bad)
            snprintf(p->bad_what, sizeof p->bad_what, "phase '%s' done %d total %d", phase ? phase : "(null)", done,
                     total);
        p->bad++;
    }
    if (p->countdown > 0 && --p->countdown == 0) {
        p->cancels++;
        return 1;
    }
    return 0;
}

/* ---- the shadow of a context ---------------------------------------------------------------- */

typedef struct {
    h3_ctx *ctx;
    bool hooked;           /* h3_set_progress installed on_progress */
    bool have;             /* a prepared request exists (from h3_render_info_get after every call) */
    h3_render_info info;   /* its shapes */
    int replaced;          /* 0: the render owns the transformer state; 1: a public transformer call may
                              have replaced it; 2: a successful h3_dit_denoise/h3_dit_forward did */
} shadow;

static long g_stat[32];
enum { S_CALLS, S_OK, S_FAIL, S_PREPARED, S_STEPS, S_DECODES, S_VDEC, S_ADEC, S_DENOISE, S_FORWARD, S_CANCELLED,
       S_STEP_REFUSED, S_CONTEXTS, S_TEXT };

static void sync_state(shadow *s)
{
    h3_render_info ri;
    memset(&ri, 0, sizeof ri);
    ri.struct_size = sizeof ri;
    h3_err_clear();
    int rc = h3_render_info_get(s->ctx, &ri);
    EXPECT(rc == 0 || (rc == -H3_E_INVALID && h3_last_error()[0]), "h3_render_info_get: %d %s", rc, h3_last_error());
    bool had = s->have;
    s->have = rc == 0;
    if (s->have) {
        EXPECT(ri.steps_done >= 0 && ri.steps_done <= ri.steps && ri.steps >= 1, "render info steps %d/%d",
               ri.steps_done, ri.steps);
        EXPECT(ri.width > 0 && ri.height > 0 && ri.frames > 0 && ri.audio_samples > 0 && ri.prompt_tokens > 0 &&
                   ri.sequence == ri.prompt_tokens + 2LL * ri.audio_latents +
                                      (int64_t)ri.latent_frames * (ri.latent_height / 2) * (ri.latent_width / 2),
               "inconsistent render info");
        s->info = ri;
    }
    if (!s->have || !had) s->replaced = 0;
}

/* Arms the progress hook to cancel within the next few reports, sometimes. */
static void arm_cancel(void) { g_prog.countdown = chance(12) ? 1 + rint_(5) : 0; }

/* After a call that reports progress: cancelled by the hook <=> failed with H3_E_CANCELLED. */
static void expect_cancel_rule(const char *what, long long rc, long cancels_before)
{
    bool cancelled = g_prog.cancels != cancels_before;
    g_prog.countdown = 0;
    EXPECT(cancelled == (rc == -H3_E_CANCELLED), "%s: the hook %s cancel but the call returned %lld (%s)", what,
           cancelled ? "did" : "did not", rc, h3_last_error());
    if (cancelled) g_stat[S_CANCELLED]++;
}

/* ---- requests ------------------------------------------------------------------------------- */

static const char *k_prompts[] = {"red", "a red dot on", "on", "<|im_start|>red<|im_end|>", "e\xcc\x81t\xc3\xa9",
                                  "  spaced  out\n\n", "12345 67", "x"};
static const char *k_bad_prompts[] = {"", "\xff\xfe", "ab\xc3", "\xed\xa0\x80"}; /* empty, invalid UTF-8 */

static int g_valid_frames[] = {1, 5, 6, 20, 22, 23, 39};

/* A request; *valid says whether h3_plan / h3_prepare must accept it. */
static void make_request(h3_request *q, bool *valid, const char **why)
{
    h3_request_default(NULL, q);
    q->prompt = k_prompts[rint_((int)(sizeof k_prompts / sizeof *k_prompts))];
    int sides[] = {8, 16, 8, 8, 24, 32};
    do {
        q->width = sides[rint_(6)];
        q->height = sides[rint_(6)];
    } while (q->width * q->height > MAX_PIXELS);
    q->frames = chance(75) ? 22 : g_valid_frames[rint_((int)(sizeof g_valid_frames / sizeof *g_valid_frames))];
    q->steps = 2 + rint_(3);
    q->seed = rnd();
    q->vae_tile_px = chance(80) ? 0 : (chance(50) ? 12 : 16);
    *valid = true;
    *why = "valid";
    if (!chance(25)) return;
    *valid = false;
    switch (rint_(12)) {
    case 0: q->width = 12, *why = "width not a multiple of 8"; break;
    case 1: q->height = 0, *why = "height 0"; break;
    case 2: q->width = 64, q->height = 64, *why = "over max_pixels"; break;
    case 3: q->frames = chance(50) ? 0 : -3, *why = "frames < 1"; break;
    case 4: q->frames = 41, *why = "over max_frames"; break;
    case 5: q->steps = chance(50) ? 1 : 1001 + rint_(1000000), *why = "steps out of range"; break;
    case 6: q->steps = INT32_MAX, *why = "huge steps"; break;
    case 7: q->prompt = NULL, *why = "NULL prompt"; break;
    case 8: q->prompt = k_bad_prompts[rint_(4)], *why = "empty or invalid UTF-8 prompt"; break;
    case 9: q->struct_size = chance(50) ? 8 : sizeof *q + 8, *why = "bad struct_size"; break;
    case 10: q->vae_tile_px = chance(50) ? -4 : (chance(50) ? 6 : 8), *why = "bad VAE tile"; break;
    default: q->width = -8, *why = "negative width"; break;
    }
}

/* The request as an older caller lays it out: exactly struct_size bytes, so reading past them is an
   ASan error. Caller frees. */
static h3_request *request_copy(const h3_request *q)
{
    size_t n = q->struct_size;
    if (n > sizeof *q) {
        h3_request *w = xalloc(1, n);
        memset(w, 0, n);
        memcpy(w, q, sizeof *q);
        return w;
    }
    h3_request *c = xalloc(1, n < 8 ? 8 : n);
    memcpy(c, q, n < 8 ? 8 : n);
    return c;
}

static void describe_request(const char *fn, const h3_request *q, const char *why)
{
    trace("%s(%dx%d, %d frames, %d steps, tile %d, struct %u, prompt %s%.20s%s) [%s]", fn, q->width, q->height,
          q->frames, q->steps, q->vae_tile_px, q->struct_size, q->prompt ? "\"" : "", q->prompt ? q->prompt : "NULL",
          q->prompt ? "\"" : "", why);
}

/* ---- the calls ----------------------------------------------------------------------------- */

static bool is_untokenizable(const char *why)
{
    return !strcmp(why, "empty or invalid UTF-8 prompt") || !strcmp(why, "NULL prompt");
}

static void call_plan(shadow *s)
{
    h3_request q;
    bool valid;
    const char *why;
    make_request(&q, &valid, &why);
    /* h3_plan validates shapes and does not tokenize: a prompt-only problem may pass or be refused */
    bool prompt_only = is_untokenizable(why);
    h3_render_info ri;
    memset(&ri, 0, sizeof ri);
    ri.struct_size = chance(92) ? sizeof ri : (uint32_t)rint_(200);
    if (ri.struct_size != sizeof ri) valid = false, why = "bad render_info struct_size";
    bool null_req = chance(3);
    if (null_req) valid = false, why = "NULL request";
    describe_request("h3_plan", &q, why);
    h3_request *c = request_copy(&q);
    h3_err_clear();
    int rc = h3_plan(s->ctx, null_req ? NULL : c, &ri);
    contract("h3_plan", rc);
    if (valid)
        EXPECT(rc == 0, "h3_plan refused a valid request: %d %s", rc, h3_last_error());
    else if (prompt_only)
        EXPECT(rc == 0 || rc == -H3_E_INVALID, "h3_plan (%s): %d", why, rc);
    else
        EXPECT(rc == -H3_E_INVALID, "h3_plan of an invalid request (%s): %d", why, rc);
    if (rc == 0)
        EXPECT(ri.width == q.width && ri.height == q.height && ri.frames >= q.frames && (ri.frames - 5) % 17 == 0 &&
                   ri.prompt_tokens == 0 && ri.latent_channels == VC && ri.audio_latent_channels == AC &&
                   ri.sample_rate == AV_RATE && ri.fps == 24 && ri.latent_height * VV_SP == q.height &&
                   ri.latent_width * VV_SP == q.width &&
                   ri.audio_samples == h3_audio_samples(s->ctx, ri.audio_latents) &&
                   ri.audio_latents == (int)lround(ri.frames / 24.0 * 4.0),
               "h3_plan shapes for %dx%d x %d frames", q.width, q.height, q.frames);
    free(c);
}

static void call_prepare(shadow *s, const h3_request *fixed)
{
    h3_request q;
    bool valid = true;
    const char *why = "fixed";
    if (fixed)
        q = *fixed;
    else
        make_request(&q, &valid, &why);
    bool null_req = !fixed && chance(2);
    if (null_req) valid = false, why = "NULL request";
    /* Injected noise, sized by a plan of the same request (exactly as h3.h documents). */
    float *vn = NULL, *an = NULL;
    h3_parity par, *pc = NULL;
    memset(&par, 0, sizeof par);
    par.struct_size = sizeof par;
    h3_render_info plan;
    memset(&plan, 0, sizeof plan);
    plan.struct_size = sizeof plan;
    bool planned = valid && h3_plan(s->ctx, &q, &plan) == 0;
    if (planned && !fixed && chance(20)) {
        int64_t nv = (int64_t)plan.latent_channels * plan.latent_frames * plan.latent_height * plan.latent_width;
        int64_t na = 2LL * plan.audio_latent_channels * plan.audio_latents;
        if (chance(70)) {
            vn = xalloc((size_t)nv, sizeof *vn);
            for (int64_t i = 0; i < nv; i++) vn[i] = frand();
        }
        if (chance(70)) {
            an = xalloc((size_t)na, sizeof *an);
            for (int64_t i = 0; i < na; i++) an[i] = frand();
        }
        par.video_noise = vn;
        par.audio_noise = an;
        if (chance(10)) {
            /* an older caller's parity struct (the two noises only), or one of no known size */
            par.struct_size = chance(50) ? (uint32_t)(offsetof(h3_parity, audio_noise) + sizeof par.audio_noise)
                                         : (chance(50) ? 4 : (uint32_t)sizeof par + 8);
            if (par.struct_size == 4 || par.struct_size > sizeof par) valid = false, why = "bad h3_parity struct_size";
        }
        /* exactly struct_size bytes, as its caller declared them: reading past them is an ASan error */
        size_t np = par.struct_size > sizeof par ? par.struct_size : sizeof par;
        pc = xalloc(1, np);
        memset(pc, 0, np);
        memcpy(pc, &par, par.struct_size < sizeof par ? par.struct_size : sizeof par);
        q.parity = pc;
    }
    if (valid && !fixed && chance(10)) q.struct_size = offsetof(h3_request, vae_tile_px); /* an older caller */
    describe_request("h3_prepare", &q, why);
    h3_request *c = request_copy(&q);
    if (!fixed) arm_cancel();
    long cb = g_prog.cancels;
    h3_err_clear();
    int rc = h3_prepare(s->ctx, null_req ? NULL : c);
    contract("h3_prepare", rc);
    expect_cancel_rule("h3_prepare", rc, cb);
    if (valid)
        EXPECT(rc == 0 || rc == -H3_E_CANCELLED, "h3_prepare refused a valid request: %d %s", rc, h3_last_error());
    else
        EXPECT(rc < 0, "h3_prepare accepted an invalid request (%s)", why);
    free(c);
    free(pc);
    free(vn);
    free(an);
    sync_state(s);
    if (rc == 0) {
        g_stat[S_PREPARED]++;
        s->replaced = 0;
        const h3_render_info *ri = &s->info;
        EXPECT(s->have && ri->steps_done == 0 && ri->steps == q.steps - 1 && ri->prompt_tokens > 0, "after prepare");
        if (planned)
            EXPECT(ri->width == plan.width && ri->height == plan.height && ri->frames == plan.frames &&
                       ri->latent_frames == plan.latent_frames && ri->audio_latents == plan.audio_latents &&
                       ri->audio_samples == plan.audio_samples,
                   "h3_prepare and h3_plan disagree on the shapes");
    }
}

static void call_step(shadow *s)
{
    trace("h3_step");
    arm_cancel();
    long cb = g_prog.cancels;
    h3_err_clear();
    int rc = h3_step(s->ctx);
    contract("h3_step", rc);
    expect_cancel_rule("h3_step", rc, cb);
    if (!s->have) {
        EXPECT(rc == -H3_E_INVALID, "h3_step without a prepared request: %d", rc);
    } else if (s->info.steps_done >= s->info.steps) {
        EXPECT(rc == 0, "h3_step after the last step: %d %s", rc, h3_last_error());
    } else if (s->replaced == 2) {
        /* h3.h: a step after the public transformer entry points replaced the prepared request's
           transformer state returns H3_E_INVALID and leaves the context usable. */
        EXPECT(rc == -H3_E_INVALID || rc == -H3_E_CANCELLED,
               "h3_step after h3_dit_denoise/h3_dit_forward replaced the request's state: %d", rc);
    } else if (s->replaced == 1) {
        EXPECT(rc >= 0 || rc == -H3_E_INVALID || rc == -H3_E_CANCELLED, "h3_step: %d %s", rc, h3_last_error());
    } else {
        EXPECT(rc == s->info.steps - s->info.steps_done - 1 || rc == -H3_E_CANCELLED, "h3_step returned %d, %d left",
               rc, s->info.steps - s->info.steps_done - 1);
    }
    if (rc >= 0) g_stat[S_STEPS]++;
    if (rc == -H3_E_INVALID && s->have && s->replaced) g_stat[S_STEP_REFUSED]++;
    sync_state(s);
}

/* Finish the prepared request's steps (stops at the first failure). */
static void run_steps(shadow *s)
{
    for (int k = 0; k < 8 && s->have && s->info.steps_done < s->info.steps; k++) {
        int before = s->info.steps_done;
        call_step(s);
        if (!s->have || s->info.steps_done == before) break;
    }
}

static void check_pcm(const float *pcm, int64_t n)
{
    bool ok = true;
    for (int64_t i = 0; i < n && ok; i++) ok = pcm[i] >= -1.0f && pcm[i] <= 1.0f;
    EXPECT(ok, "decoded PCM outside [-1, 1] or not finite");
}

static void call_decode(shadow *s, bool f32)
{
    const h3_render_info ri = s->info;
    bool have = s->have;
    int64_t npx = have ? (int64_t)ri.frames * ri.height * ri.width * 3 : 0, npcm = have ? 2 * ri.audio_samples : 0;
    /* PCM less often than frames: the audio decoder is the slowest call of this model under ASan */
    bool want_v = have && (f32 ? chance(90) : chance(65)), want_a = !f32 && have && chance(40);
    uint8_t *rgb = !f32 && want_v ? xalloc((size_t)npx, 1) : NULL;
    float *px = f32 && want_v ? xalloc((size_t)npx, sizeof(float)) : NULL;
    float *pcm = want_a ? xalloc((size_t)npcm, sizeof(float)) : NULL;
    trace("%s(%s, %s)", f32 ? "h3_decode_video_f32" : "h3_decode", want_v ? "video" : "NULL", want_a ? "pcm" : "NULL");
    arm_cancel();
    long cb = g_prog.cancels;
    h3_err_clear();
    int rc = f32 ? h3_decode_video_f32(s->ctx, px) : h3_decode(s->ctx, rgb, pcm);
    contract("h3_decode", rc);
    expect_cancel_rule("h3_decode", rc, cb);
    if (!have || ri.steps_done < ri.steps || (!want_v && !want_a)) {
        EXPECT(rc == -H3_E_INVALID, "h3_decode (render %d, %d of %d steps, buffers %d %d): %d", have, ri.steps_done,
               ri.steps, want_v, want_a, rc);
    } else if (want_v && ri.latent_frames < 3) {
        /* 1-5 frames give 2 latent frames, fewer than the video decoder's 3: refused with a message */
        EXPECT(rc < 0, "h3_decode of %d latent frames succeeded", ri.latent_frames);
    } else {
        EXPECT(rc == 0 || rc == -H3_E_CANCELLED, "h3_decode failed: %d %s", rc, h3_last_error());
    }
    if (rc == 0) {
        g_stat[S_DECODES]++;
        if (pcm) check_pcm(pcm, npcm);
        if (px) {
            bool ok = true;
            for (int64_t i = 0; i < npx && ok; i++) ok = px[i] >= 0.0f && px[i] <= 1.0f;
            EXPECT(ok, "h3_decode_video_f32 values outside [0, 1]");
        }
    }
    free(rgb);
    free(px);
    free(pcm);
}

static void call_render_info(shadow *s)
{
    h3_render_info ri;
    memset(&ri, 0, sizeof ri);
    bool good = chance(80);
    ri.struct_size = good ? sizeof ri : (uint32_t)(chance(50) ? 0 : sizeof ri - 4);
    trace("h3_render_info_get(struct %u)", ri.struct_size);
    h3_err_clear();
    int rc = h3_render_info_get(chance(3) ? NULL : s->ctx, &ri);
    contract("h3_render_info_get", rc);
    if (!good) EXPECT(rc == -H3_E_INVALID, "h3_render_info_get with struct_size %u: %d", ri.struct_size, rc);
}

static void call_get_latents(shadow *s)
{
    const h3_render_info ri = s->info;
    int64_t nv = s->have ? (int64_t)ri.latent_channels * ri.latent_frames * ri.latent_height * ri.latent_width : 1;
    int64_t na = s->have ? 2LL * ri.audio_latent_channels * ri.audio_latents : 1;
    float *v = chance(70) ? xalloc((size_t)nv, sizeof(float)) : NULL;
    float *a = chance(70) ? xalloc((size_t)na, sizeof(float)) : NULL;
    trace("h3_get_latents(%s, %s)", v ? "video" : "NULL", a ? "audio" : "NULL");
    h3_err_clear();
    int rc = h3_get_latents(s->ctx, s->have ? v : NULL, s->have ? a : NULL);
    contract("h3_get_latents", rc);
    EXPECT(s->have ? rc == 0 : rc == -H3_E_INVALID, "h3_get_latents: %d (render %d)", rc, s->have);
    if (rc == 0) {
        if (v) EXPECT(all_finite(v, nv), "video latents not finite");
        if (a) EXPECT(all_finite(a, na), "audio latents not finite");
    }
    free(v);
    free(a);
}

static void call_prompt_tokens(shadow *s)
{
    int n = s->have ? s->info.prompt_tokens : 2;
    int caps[] = {0, 1, n, n + 3, -1, INT32_MIN};
    int cap = caps[rint_(6)];
    int32_t *ids = chance(85) ? xalloc(cap > 0 ? (size_t)cap : 1, sizeof *ids) : NULL;
    trace("h3_prompt_tokens(%s, cap %d)", ids ? "ids" : "NULL", cap);
    h3_err_clear();
    int rc = h3_prompt_tokens(s->ctx, ids, cap);
    contract("h3_prompt_tokens", rc);
    if (!s->have)
        EXPECT(rc == -H3_E_INVALID, "h3_prompt_tokens without a request: %d", rc);
    else if (cap >= 0 && (ids || cap == 0))
        EXPECT(rc == n, "h3_prompt_tokens: %d, expected %d", rc, n);
    else /* a negative cap, or no buffer for a positive one: the count, or refused */
        EXPECT(rc == n || rc == -H3_E_INVALID, "h3_prompt_tokens(%s, %d): %d", ids ? "ids" : "NULL", cap, rc);
    if (rc > 0 && ids && cap > 0)
        for (int i = 0; i < cap && i < rc; i++) EXPECT(ids[i] >= 0 && ids[i] < 261, "token id %d", ids[i]);
    free(ids);
}

static void call_text_encode(shadow *s)
{
    h3_err_clear();
    int hidden = h3_text_hidden_size(s->ctx);
    EXPECT(hidden == TXT_H, "h3_text_hidden_size %d", hidden);
    int ns[] = {1, 2, 3, 4, 7, 0, -1, INT32_MAX};
    int n = ns[chance(85) ? rint_(5) : 5 + rint_(3)];
    bool valid = n >= 1 && n <= 64;
    int64_t cnt = valid ? n : 1;
    int32_t *ids = xalloc((size_t)cnt, sizeof *ids);
    /* a few distinct prompts, so the cache answers some of them */
    uint64_t pick = rnd() % 5;
    for (int64_t i = 0; i < cnt; i++) ids[i] = (int32_t)((pick * 37 + (uint64_t)i * 11) % TXT_VOCAB);
    const char *why = valid ? "valid" : "bad count";
    if (valid && chance(10)) {
        ids[rint_((int)cnt)] = chance(50) ? TXT_VOCAB : -1;
        valid = false, why = "id outside vocab";
    }
    float *out = xalloc((size_t)cnt * TXT_H, sizeof *out);
    bool null_ids = chance(3), null_out = chance(3);
    if (null_ids || null_out) valid = false, why = "NULL buffer";
    trace("h3_text_encode(n %d) [%s]", n, why);
    arm_cancel();
    long cb = g_prog.cancels;
    h3_err_clear();
    int rc = h3_text_encode(s->ctx, null_ids ? NULL : ids, n, null_out ? NULL : out);
    contract("h3_text_encode", rc);
    expect_cancel_rule("h3_text_encode", rc, cb);
    if (valid)
        EXPECT(rc == 0 || rc == -H3_E_CANCELLED, "h3_text_encode: %d %s", rc, h3_last_error());
    else
        EXPECT(rc == -H3_E_INVALID || rc == -H3_E_CANCELLED, "h3_text_encode (%s): %d", why, rc);
    if (rc == 0) {
        g_stat[S_TEXT]++;
        EXPECT(all_finite(out, cnt * TXT_H), "text embeddings not finite");
    }
    free(ids);
    free(out);
}

static void call_text_cache(shadow *s)
{
    switch (rint_(3)) {
    case 0: {
        uint32_t sizes[] = {sizeof(h3_text_cache_stats), offsetof(h3_text_cache_stats, misses),
                            offsetof(h3_text_cache_stats, bytes), 0, 4, sizeof(h3_text_cache_stats) + 8};
        int k = rint_(6);
        uint32_t sz = sizes[k];
        /* exactly struct_size bytes: the library must not write past what the caller declared */
        h3_text_cache_stats *st = xalloc(sz > 8 ? sz : 8, 1);
        memset(st, 0, sz > 8 ? sz : 8);
        memcpy(st, &sz, sizeof sz); /* struct_size is the first member */
        trace("h3_text_cache_stats_get(struct %u)", sz);
        h3_err_clear();
        int rc = h3_text_cache_stats_get(s->ctx, st);
        contract("h3_text_cache_stats_get", rc);
        EXPECT(k < 3 ? rc == 0 : rc == -H3_E_INVALID, "h3_text_cache_stats_get(struct %u): %d", sz, rc);
        if (rc == 0 && k == 0) EXPECT(st->budget == 0 || st->bytes <= st->budget, "cache over its budget");
        free(st);
        break;
    }
    case 1: {
        uint64_t budgets[] = {0, 100, 1u << 20, 256u << 20, UINT64_MAX};
        uint64_t b = budgets[rint_(5)];
        trace("h3_text_cache_set_budget(%llu)", (unsigned long long)b);
        h3_err_clear();
        int rc = h3_text_cache_set_budget(s->ctx, b);
        contract("h3_text_cache_set_budget", rc);
        EXPECT(rc == 0, "h3_text_cache_set_budget: %d", rc);
        h3_text_cache_stats st = {.struct_size = sizeof st};
        EXPECT(h3_text_cache_stats_get(s->ctx, &st) == 0 && st.budget == b && st.bytes <= b,
               "after set_budget(%llu): budget %llu, %llu bytes", (unsigned long long)b,
               (unsigned long long)st.budget, (unsigned long long)st.bytes);
        break;
    }
    default: {
        trace("h3_text_cache_clear");
        h3_text_cache_clear(s->ctx);
        h3_text_cache_stats st = {.struct_size = sizeof st};
        EXPECT(h3_text_cache_stats_get(s->ctx, &st) == 0 && st.entries == 0 && st.bytes == 0, "cache not cleared");
        break;
    }
    }
}

/* A packed-layout geometry, valid or not. */
typedef struct {
    int64_t n_text;
    int T, lh, lw, Ta, n_anchors;
    int32_t anchors[3];
    uint8_t tags[8];
    bool use_tags, valid;
    const char *why;
} geom;

static void make_geom(geom *g, bool allow_invalid)
{
    memset(g, 0, sizeof *g);
    g->n_text = 1 + rint_(5);
    g->T = 1 + rint_(3);
    g->lh = chance(60) ? 2 : 4;
    g->lw = chance(60) ? 2 : 4;
    g->Ta = 1 + rint_(4);
    g->n_anchors = chance(70) ? 0 : 1 + rint_(2);
    for (int i = 0; i < g->n_anchors; i++) g->anchors[i] = rint_(2);
    g->use_tags = chance(30);
    for (int i = 0; i < 8; i++) g->tags[i] = (uint8_t)rint_(2);
    g->valid = true;
    g->why = "valid";
    if (!allow_invalid || !chance(30)) return;
    g->valid = false;
    switch (rint_(7)) {
    case 0: g->n_text = chance(50) ? 0 : -1, g->why = "no text rows"; break;
    case 1: g->T = 0, g->why = "no latent frames"; break;
    case 2: g->lh = 3, g->why = "height not a multiple of the patch"; break;
    case 3: g->lw = 0, g->why = "width 0"; break;
    case 4: g->Ta = chance(50) ? 0 : -2, g->why = "no audio latents"; break;
    case 5: g->n_anchors = 1, g->anchors[0] = 7, g->why = "bad anchor"; break;
    default: g->use_tags = true, g->tags[0] = 2, g->why = "bad text tag"; break;
    }
}

static int64_t geom_rows(const geom *g) /* the layout's L, by the documented formula */
{
    return g->n_text + (int64_t)(g->n_anchors + g->T) * (g->lh / 2) * (g->lw / 2) + 2LL * g->Ta;
}

typedef struct {
    int64_t L, nv, na;
    double *pos;
    int64_t *tags, *ti, *vi, *ai;
} layout_bufs;

static void layout_free(layout_bufs *b)
{
    free(b->pos);
    free(b->tags);
    free(b->ti);
    free(b->vi);
    free(b->ai);
    memset(b, 0, sizeof *b);
}

/* h3_dit_packed_layout: sizes with NULL buffers, then fills exactly sized ones (each optional unless
   `all`). Returns L or the negative code. */
static int64_t packed_layout(shadow *s, const geom *g, bool all, layout_bufs *b)
{
    memset(b, 0, sizeof *b);
    trace("h3_dit_packed_layout(n_text %lld, T %d, %dx%d, Ta %d, anchors %d, tags %d) [%s]", (long long)g->n_text,
          g->T, g->lh, g->lw, g->Ta, g->n_anchors, g->use_tags, g->why);
    const uint8_t *tags = g->use_tags ? g->tags : NULL;
    h3_err_clear();
    int64_t L = h3_dit_packed_layout(s->ctx, g->n_text, tags, g->T, g->lh, g->lw, g->Ta, g->anchors, g->n_anchors, NULL,
                                     NULL, NULL, NULL, NULL);
    contract("h3_dit_packed_layout", L);
    if (g->valid)
        EXPECT(L == geom_rows(g), "h3_dit_packed_layout: %lld rows, expected %lld (%s)", (long long)L,
               (long long)geom_rows(g), h3_last_error());
    else
        EXPECT(L == -H3_E_INVALID, "h3_dit_packed_layout accepted an invalid geometry (%s): %lld", g->why,
               (long long)L);
    if (L <= 0) return L;
    b->L = L;
    b->nv = (int64_t)(g->n_anchors + g->T) * (g->lh / 2) * (g->lw / 2);
    b->na = 2LL * g->Ta;
    if (all || chance(70)) b->pos = xalloc((size_t)L * 3, sizeof *b->pos);
    if (all || chance(70)) b->tags = xalloc((size_t)L, sizeof *b->tags);
    if (all || chance(70)) b->ti = xalloc((size_t)g->n_text, sizeof *b->ti);
    if (all || chance(70)) b->vi = xalloc((size_t)b->nv, sizeof *b->vi);
    if (all || chance(70)) b->ai = xalloc((size_t)b->na, sizeof *b->ai);
    h3_err_clear();
    int64_t L2 = h3_dit_packed_layout(s->ctx, g->n_text, tags, g->T, g->lh, g->lw, g->Ta, g->anchors, g->n_anchors,
                                      b->pos, b->tags, b->ti, b->vi, b->ai);
    contract("h3_dit_packed_layout", L2);
    EXPECT(L2 == L, "h3_dit_packed_layout with buffers: %lld, without: %lld", (long long)L2, (long long)L);
    if (b->ti && b->vi && b->ai && L2 == L) {
        /* the three index lists partition the sequence */
        uint8_t *seen = calloc((size_t)L, 1);
        bool ok = true;
        const int64_t *lists[3] = {b->ti, b->vi, b->ai};
        int64_t lens[3] = {g->n_text, b->nv, b->na};
        for (int k = 0; k < 3; k++)
            for (int64_t i = 0; i < lens[k]; i++) {
                int64_t r = lists[k][i];
                if (r < 0 || r >= L || seen[r]++) ok = false;
            }
        EXPECT(ok, "layout indices do not partition the %lld rows", (long long)L);
        free(seen);
    }
    return L;
}

static void call_packed_layout(shadow *s)
{
    geom g;
    make_geom(&g, true);
    layout_bufs b;
    packed_layout(s, &g, false, &b);
    layout_free(&b);
}

/* Marks the request's transformer state as replaced by a public transformer call. */
static void note_replaced(shadow *s, int rc)
{
    if (!s->have) return;
    if (rc >= 0)
        s->replaced = 2;
    else if (s->replaced == 0)
        s->replaced = 1;
}

static void call_dit_forward(shadow *s)
{
    geom g;
    make_geom(&g, false);
    layout_bufs b;
    int64_t L = packed_layout(s, &g, true, &b);
    if (L <= 0) return;
    const int PD = VC * 4;
    int nts = 1 + rint_(3);
    float *hs = xalloc((size_t)(b.nv * PD), sizeof(float)), *as = xalloc((size_t)(b.na * AC), sizeof(float));
    float *enc = xalloc((size_t)(g.n_text * TXT_H), sizeof(float)), *ts = xalloc((size_t)nts, sizeof(float));
    int64_t *tidx = xalloc((size_t)L, sizeof(int64_t));
    float *out_v = xalloc((size_t)(b.nv * PD), sizeof(float)), *out_a = xalloc((size_t)(b.na * AC), sizeof(float));
    for (int64_t i = 0; i < b.nv * PD; i++) hs[i] = frand();
    for (int64_t i = 0; i < b.na * AC; i++) as[i] = frand();
    for (int64_t i = 0; i < g.n_text * TXT_H; i++) enc[i] = frand();
    for (int i = 0; i < nts; i++) ts[i] = (float)(i + 1) / (float)(nts + 1);
    for (int64_t i = 0; i < L; i++) tidx[i] = rint_(nts);
    bool valid = true;
    const char *why = "valid";
    int32_t nts_arg = nts;
    int64_t n_text = g.n_text;
    const float *enc_arg = enc;
    if (chance(30)) {
        valid = false;
        switch (rint_(6)) {
        case 0: tidx[rint_((int)L)] = nts, why = "timestep index out of range"; break;
        case 1: nts_arg = 0, why = "no timesteps"; break;
        case 2: b.vi[0] = b.ti[0], why = "a row addressed twice"; break;
        case 3: b.ai[b.na - 1] = L, why = "an index outside the sequence"; break;
        case 4: enc_arg = NULL, why = "NULL encoder states"; break;
        default: n_text = 0, why = "no text rows"; break;
        }
    }
    trace("h3_dit_forward(L %lld, %lld video rows, %lld audio rows, %d timesteps) [%s]", (long long)L, (long long)b.nv,
          (long long)b.na, nts_arg, why);
    h3_err_clear();
    int rc = h3_dit_forward(s->ctx, hs, b.nv, as, b.na, enc_arg, n_text, ts, nts_arg, tidx, b.tags, b.pos, L, b.vi,
                            b.ai, b.ti, out_v, out_a);
    contract("h3_dit_forward", rc);
    if (valid)
        EXPECT(rc == 0, "h3_dit_forward: %d %s", rc, h3_last_error());
    else
        EXPECT(rc == -H3_E_INVALID, "h3_dit_forward accepted invalid input (%s): %d", why, rc);
    if (rc == 0) {
        g_stat[S_FORWARD]++;
        EXPECT(all_finite(out_v, b.nv * PD) && all_finite(out_a, b.na * AC), "forward outputs not finite");
    }
    note_replaced(s, rc);
    free(hs), free(as), free(enc), free(ts), free(tidx), free(out_v), free(out_a);
    layout_free(&b);
}

static int dit_denoise(shadow *s, const geom *g, int steps, bool null_buf, bool valid, const char *why)
{
    int64_t nv = (int64_t)VC * g->T * g->lh * g->lw, na = 2LL * AC * g->Ta;
    int64_t nt = g->n_text > 0 ? g->n_text : 1;
    float *emb = xalloc((size_t)(nt * TXT_H), sizeof(float));
    float *lat = xalloc(nv > 0 ? (size_t)nv : 1, sizeof(float)), *alat = xalloc(na > 0 ? (size_t)na : 1, sizeof(float));
    for (int64_t i = 0; i < nt * TXT_H; i++) emb[i] = frand();
    for (int64_t i = 0; i < nv; i++) lat[i] = frand();
    for (int64_t i = 0; i < na; i++) alat[i] = frand();
    trace("h3_dit_denoise(n_text %lld, T %d, %dx%d, Ta %d, steps %d%s) [%s]", (long long)g->n_text, g->T, g->lh, g->lw,
          g->Ta, steps, null_buf ? ", NULL latents" : "", why);
    h3_err_clear();
    int rc = h3_dit_denoise(s->ctx, emb, g->n_text, g->use_tags ? g->tags : NULL, g->T, g->lh, g->lw, g->Ta, steps,
                            null_buf ? NULL : lat, alat);
    contract("h3_dit_denoise", rc);
    if (valid)
        EXPECT(rc == steps - 1, "h3_dit_denoise: %d, expected %d evaluations (%s)", rc, steps - 1, h3_last_error());
    else
        EXPECT(rc == -H3_E_INVALID, "h3_dit_denoise accepted invalid input (%s): %d", why, rc);
    if (rc > 0) {
        g_stat[S_DENOISE]++;
        EXPECT(all_finite(lat, nv) && all_finite(alat, na), "denoised latents not finite");
    }
    note_replaced(s, rc);
    free(emb), free(lat), free(alat);
    return rc;
}

static void call_dit_denoise(shadow *s)
{
    geom g;
    make_geom(&g, true);
    g.n_anchors = 0; /* t2va: no keyframe rows */
    if (!strcmp(g.why, "bad anchor")) g.valid = true, g.why = "valid";
    int steps = 2 + rint_(2);
    bool valid = g.valid, null_buf = false;
    const char *why = g.why;
    if (valid && chance(20)) {
        valid = false;
        if (chance(50))
            null_buf = true, why = "NULL latents";
        else
            steps = chance(50) ? 1 : (chance(50) ? -3 : 100001), why = "steps out of range";
    }
    dit_denoise(s, &g, steps, null_buf, valid, why);
}

static void call_profile(shadow *s)
{
    trace("h3_dit_profile_json");
    h3_err_clear();
    const char *j = h3_dit_profile_json(s->ctx);
    contract_ptr("h3_dit_profile_json", j);
    EXPECT(j != NULL, "h3_dit_profile_json: %s", h3_last_error());
    expect_json("h3_dit_profile_json", j);
}

static void call_video_decode(shadow *s)
{
    int Ts[] = {3, 7, 2, 0, 4};
    int T = Ts[chance(85) ? rint_(2) : 2 + rint_(3)], h = 1 + rint_(4), w = 1 + rint_(4), C = chance(92) ? VC : VC + 1;
    bool valid = C == VC && T >= 3;
    const char *why = valid ? "valid" : "bad latent shape";
    h3_video_decode_opts o;
    h3_video_decode_opts_default(&o);
    static const int tiles[][2] = {{0, 0}, {16, 8}, {12, 4}, {8, 4}, {16, 4}, {8, 8}, {6, 0}};
    int tk = chance(80) ? rint_(5) : 5 + rint_(2);
    o.tile_px = tiles[tk][0];
    o.overlap_px = tiles[tk][1];
    unsigned flags[] = {0, H3_VIDEO_RAW, H3_VIDEO_UNTILED, H3_VIDEO_RAW | H3_VIDEO_UNTILED, 8};
    o.flags = flags[chance(95) ? rint_(4) : 4];
    if (o.flags == 8) valid = false, why = "unknown flag";
    if (tk >= 5 && !(o.flags & H3_VIDEO_UNTILED)) valid = false, why = "bad tiling";
    o.progress = chance(50) ? on_progress : NULL;
    o.user = &g_prog;
    uint32_t sizes[] = {sizeof o, offsetof(h3_video_decode_opts, progress), 4, sizeof o + 4};
    int sk = chance(90) ? rint_(2) : 2 + rint_(2);
    o.struct_size = sizes[sk];
    if (sk >= 2) valid = false, why = "bad opts struct_size";
    if (sk == 1) o.progress = NULL; /* an older caller's struct has no hook: the context's is used */
    bool use_opts = chance(70);
    if (!use_opts) {
        valid = C == VC && T >= 3;
        why = valid ? "valid" : "bad latent shape";
    }
    unsigned eff_flags = use_opts ? o.flags : 0;
    int F = 0, H = 0, W = 0;
    h3_err_clear();
    int src = h3_video_decode_shape(s->ctx, T, h, w, &F, &H, &W);
    contract("h3_video_decode_shape", src);
    EXPECT(src == 0 || T < 3, "h3_video_decode_shape(%d, %d, %d): %d %s", T, h, w, src, h3_last_error());
    if (src) F = H = W = 1;
    else EXPECT(H == h * VV_SP && W == w * VV_SP && F >= 1, "h3_video_decode_shape %d %d %d", F, H, W);
    int64_t nlat = (int64_t)C * (T > 0 ? T : 1) * h * w, npx = (int64_t)F * H * W * 3;
    float *lat = xalloc((size_t)nlat, sizeof(float));
    for (int64_t i = 0; i < nlat; i++) lat[i] = frand();
    bool want_rgb = chance(70), want_px = chance(50);
    if (!want_rgb && !want_px && chance(80)) want_rgb = true;
    if (!want_rgb && !want_px) valid = false, why = "no output";
    bool null_lat = chance(3);
    if (null_lat) valid = false, why = "NULL latents";
    uint8_t *rgb = want_rgb ? xalloc((size_t)npx, 1) : NULL;
    float *px = want_px ? xalloc((size_t)npx, sizeof(float)) : NULL;
    trace("h3_video_decode(C %d, T %d, %dx%d, tile %d/%d, flags %u, struct %u, opts %d, rgb %d, px %d) [%s]", C, T, h,
          w, o.tile_px, o.overlap_px, o.flags, o.struct_size, use_opts, want_rgb, want_px, why);
    bool own_hook = use_opts && o.progress;
    if (own_hook || s->hooked) arm_cancel();
    long cb = g_prog.cancels;
    h3_err_clear();
    /* the options as their caller declared them: exactly struct_size bytes */
    size_t osz = o.struct_size > sizeof o ? o.struct_size : (o.struct_size < 8 ? 8 : o.struct_size);
    h3_video_decode_opts *op = xalloc(1, osz);
    memset(op, 0, osz);
    memcpy(op, &o, osz < sizeof o ? osz : sizeof o);
    int rc = h3_video_decode(s->ctx, null_lat ? NULL : lat, C, T, h, w, use_opts ? op : NULL, rgb, px);
    free(op);
    contract("h3_video_decode", rc);
    expect_cancel_rule("h3_video_decode", rc, cb);
    if (valid)
        EXPECT(rc == 0 || rc == -H3_E_CANCELLED, "h3_video_decode: %d %s", rc, h3_last_error());
    else
        EXPECT(rc < 0, "h3_video_decode accepted invalid input (%s)", why);
    if (rc == 0) {
        g_stat[S_VDEC]++;
        if (rgb && px && !(eff_flags & H3_VIDEO_RAW)) {
            /* uint8 frames are the float frames rounded: round(x * 255), half to even */
            bool ok = true;
            for (int64_t i = 0; i < npx && ok; i++) ok = fabsf((float)rgb[i] - px[i] * 255.0f) <= 0.5001f;
            EXPECT(ok, "rgb and float frames disagree");
        }
        if (px) EXPECT(all_finite(px, npx), "decoded pixels not finite");
    }
    free(lat), free(rgb), free(px);
}

static void call_audio_decode(shadow *s)
{
    int frames[] = {1, 2, 4, 6, 0, -1};
    int fr = frames[chance(90) ? rint_(4) : 4 + rint_(2)], ch = chance(93) ? AC : AC + 1;
    bool valid = fr >= 1 && ch == AC;
    const char *why = valid ? "valid" : "bad latent shape";
    h3_err_clear();
    int64_t S = h3_audio_samples(s->ctx, fr);
    contract("h3_audio_samples", S);
    /* at least hop (250) samples per latent frame; the transposed convolutions' kernels add a few */
    EXPECT(fr >= 1 ? S >= 250LL * fr && S < 250LL * fr + 100 : S == -H3_E_INVALID, "h3_audio_samples(%d) = %lld", fr,
           (long long)S);
    int64_t cap = S > 0 ? 2 * S : 4;
    int k = rint_(10);
    if (k == 0) cap -= 1, valid = false, why = "pcm too small";
    if (k == 1) cap += 7;
    if (k == 2) cap = 0, valid = false, why = "no pcm";
    int64_t nlat = 2LL * ch * (fr > 0 ? fr : 1);
    float *lat = xalloc((size_t)nlat, sizeof(float));
    for (int64_t i = 0; i < nlat; i++) lat[i] = 2.0f * frand();
    float *pcm = cap > 0 ? xalloc((size_t)cap, sizeof(float)) : NULL;
    bool null_lat = chance(3);
    if (null_lat) valid = false, why = "NULL latents";
    bool hook = chance(50);
    trace("h3_audio_decode(channels %d, frames %d, capacity %lld, hook %d) [%s]", ch, fr, (long long)cap, hook, why);
    if (hook) arm_cancel();
    long cb = g_prog.cancels;
    h3_err_clear();
    int rc = h3_audio_decode(s->ctx, null_lat ? NULL : lat, ch, fr, pcm, cap, hook ? on_progress : NULL, &g_prog);
    contract("h3_audio_decode", rc);
    expect_cancel_rule("h3_audio_decode", rc, cb);
    if (valid)
        EXPECT(rc == 0 || rc == -H3_E_CANCELLED, "h3_audio_decode: %d %s", rc, h3_last_error());
    else
        EXPECT(rc < 0, "h3_audio_decode accepted invalid input (%s)", why);
    if (rc == 0) {
        g_stat[S_ADEC]++;
        check_pcm(pcm, 2 * S);
    }
    free(lat), free(pcm);
}

static void call_info(shadow *s)
{
    if (chance(40)) {
        trace("h3_model_info_json");
        h3_err_clear();
        const char *j = h3_model_info_json(s->ctx);
        contract_ptr("h3_model_info_json", j);
        EXPECT(j != NULL, "h3_model_info_json: %s", h3_last_error());
        expect_json("h3_model_info_json", j);
        return;
    }
    static const int args[][4] = {{8, 8, 22, 3}, {32, 32, 39, 64}, {1344, 768, 124, 512}, {8, 8, 1, 1},
                                  {0, 8, 22, 3}, {8, 8, 22, 0}, {-8, 8, 22, 3}, {20000, 8, 22, 3}, {8, 8, 200000, 3}};
    int k = chance(80) ? rint_(4) : 4 + rint_(5);
    trace("h3_memory_estimate_json(%d, %d, %d, %d)", args[k][0], args[k][1], args[k][2], args[k][3]);
    h3_err_clear();
    const char *j = h3_memory_estimate_json(s->ctx, args[k][0], args[k][1], args[k][2], args[k][3]);
    contract_ptr("h3_memory_estimate_json", j);
    EXPECT(k < 4 ? j != NULL : j == NULL, "h3_memory_estimate_json(%d, %d, %d, %d): %s", args[k][0], args[k][1],
           args[k][2], args[k][3], j ? "accepted" : h3_last_error());
    expect_json("h3_memory_estimate_json", j);
}

static void call_misc(shadow *s)
{
    int rc;
    switch (rint_(6)) {
    case 0:
        trace("h3_model_check");
        h3_err_clear();
        rc = h3_model_check(s->ctx, rint_(2));
        contract("h3_model_check", rc);
        EXPECT(rc == 0, "h3_model_check: %d %s", rc, h3_last_error());
        break;
    case 1: {
        int lc = 0, sr = 0, hop = 0;
        trace("h3_audio_info");
        h3_err_clear();
        rc = h3_audio_info(s->ctx, chance(50) ? &lc : NULL, &sr, &hop);
        contract("h3_audio_info", rc);
        EXPECT(rc == 0 && sr == AV_RATE && hop == 250, "h3_audio_info: %d %d %d", rc, sr, hop);
        break;
    }
    case 2: {
        int T = rint_(9) - 1, h = rint_(6) - 1, w = rint_(6) - 1;
        trace("h3_video_decode_workspace(%d, %d, %d)", T, h, w);
        h3_err_clear();
        int64_t ws = h3_video_decode_workspace(s->ctx, T, h, w, NULL);
        contract("h3_video_decode_workspace", ws);
        EXPECT((ws > 0) == (T >= 3 && h >= 1 && w >= 1), "h3_video_decode_workspace(%d, %d, %d) = %lld", T, h, w,
               (long long)ws);
        break;
    }
    case 3: {
        int steps = rint_(6);
        float *sig = xalloc(steps > 0 ? (size_t)steps : 1, sizeof(float));
        float *ts = xalloc(steps > 1 ? (size_t)steps - 1 : 1, sizeof(float));
        trace("h3_sigma_schedule(%d)", steps);
        h3_err_clear();
        rc = h3_sigma_schedule(steps, 12.0, sig, chance(50) ? ts : NULL);
        contract("h3_sigma_schedule", rc);
        EXPECT(steps >= 2 ? rc == steps : rc == -H3_E_INVALID, "h3_sigma_schedule(%d): %d", steps, rc);
        free(sig), free(ts);
        break;
    }
    case 4: {
        int64_t n = rint_(5) - 1;
        float *out = xalloc(n > 0 ? (size_t)n : 1, sizeof(float));
        trace("h3_noise_fill(%lld)", (long long)n);
        h3_err_clear();
        rc = h3_noise_fill(rnd(), (uint32_t)rint_(3), rnd() >> 1, n > 0 || chance(50) ? out : NULL, n);
        contract("h3_noise_fill", rc);
        EXPECT(n >= 0 ? rc == 0 : rc == -H3_E_INVALID, "h3_noise_fill(%lld): %d", (long long)n, rc);
        free(out);
        break;
    }
    default: {
        trace("h3_threads / h3_version / h3_cpu_features / h3_device_name / h3_device_description");
        EXPECT(h3_threads(s->ctx) >= 1 && h3_threads(NULL) == 0, "h3_threads");
        EXPECT(!strcmp(h3_version(), "0.1.0") && h3_cpu_features()[0], "version / cpu features");
        const char *dev = h3_device_name(s->ctx), *desc = h3_device_description(s->ctx);
        EXPECT(dev && (!strcmp(dev, "cpu") || !strcmp(dev, "cuda") || !strcmp(dev, "metal")) && desc && desc[0],
               "device %s: %s",
               dev ? dev : "NULL", desc ? desc : "NULL");
        break;
    }
    }
}

static void call_set_progress(shadow *s)
{
    s->hooked = chance(65);
    trace("h3_set_progress(%s)", s->hooked ? "hook" : "NULL");
    h3_set_progress(s->ctx, s->hooked ? on_progress : NULL, &g_prog);
}

/* h3_init with bad arguments must fail with a message and leak nothing. */
static void call_init_bad(void)
{
    h3_options o;
    h3_options_default(&o);
    const char *dir = g_root;
    const char *why;
    h3_options *opt = NULL;
    switch (rint_(7)) {
    case 0: dir = NULL, why = "NULL directory"; break;
    case 1: dir = "", why = "empty directory"; break;
    case 2: dir = path_of("no_such_dir"), why = "missing directory"; break;
    case 3: dir = path_of("a_file"), why = "a file"; break;
    case 4: dir = path_of("FL2VA/tokenizer"), why = "not a model"; break;
    case 5:
        o.threads = chance(50) ? -1 : 5000, why = "bad thread count";
        opt = &o;
        break;
    default: {
        /* exactly struct_size bytes, too few or too many for this library */
        uint32_t sz = chance(50) ? 4 : sizeof o + 16;
        opt = xalloc(1, sz);
        memset(opt, 0, sz);
        memcpy(opt, &sz, sizeof sz); /* struct_size is the first member */
        why = "bad options struct_size";
        break;
    }
    }
    trace("h3_init [%s]", why);
    h3_err_clear();
    h3_ctx *c = h3_init(dir, opt);
    contract_ptr("h3_init", c);
    EXPECT(c == NULL, "h3_init accepted %s", why);
    h3_free(c);
    if (opt && opt != &o) free(opt);
}

static h3_ctx *open_ctx(int threads, bool older_options)
{
    h3_options o;
    h3_options_default(&o);
    o.threads = threads;
    /* the same engine on every machine (an older caller's struct gets AUTO); H3_API_SEQ_DEVICE=metal runs the
       sequences on the Metal backend (on Linux its test double: tests/test_metal_double.py) */
    const char *dv = getenv("H3_API_SEQ_DEVICE");
    o.device = dv && !strcmp(dv, "metal") ? H3_DEVICE_METAL : H3_DEVICE_CPU;
    h3_err_clear();
    h3_ctx *c;
    if (older_options) {
        /* an older caller's struct: no device fields, exactly that many bytes */
        size_t sz = offsetof(h3_options, device);
        o.struct_size = (uint32_t)sz;
        void *p = xalloc(1, sz);
        memcpy(p, &o, sz);
        c = h3_init(g_root, p);
        free(p);
    } else {
        c = h3_init(g_root, &o);
    }
    CHECK_MSG(c != NULL, "h3_init(%s): %s", g_root, h3_last_error());
    if (c && o.device == H3_DEVICE_METAL && !older_options)
        CHECK_MSG(!strcmp(h3_device_name(c), "metal"), "asked for metal, got %s", h3_device_name(c));
    if (c) g_stat[S_CONTEXTS]++;
    return c;
}

/* ---- fixed sequences ------------------------------------------------------------------------ */

typedef struct {
    uint8_t *rgb;
    float *pcm;
    int64_t npx, npcm;
} render_out;

/* prepare -> steps -> decode on a fresh context; 0 or the failing call's code. */
static int full_render(int threads, const h3_request *q, render_out *out)
{
    shadow s = {.ctx = open_ctx(threads, false)};
    memset(out, 0, sizeof *out);
    if (!s.ctx) return -1;
    call_prepare(&s, q);
    run_steps(&s);
    int rc = -1;
    if (s.have && s.info.steps_done == s.info.steps) {
        out->npx = (int64_t)s.info.frames * s.info.height * s.info.width * 3;
        out->npcm = 2 * s.info.audio_samples;
        out->rgb = xalloc((size_t)out->npx, 1);
        out->pcm = xalloc((size_t)out->npcm, sizeof(float));
        h3_err_clear();
        rc = h3_decode(s.ctx, out->rgb, out->pcm);
        EXPECT(rc == 0, "h3_decode: %s", h3_last_error());
    }
    h3_free(s.ctx);
    return rc;
}

/* The API's own range checks (api/render_api.c, api/context.c): every number of a request at the
   values a caller may send whatever its language (0, -1, INT32_MIN, INT32_MAX, nan, inf) is refused
   by h3_plan and h3_prepare with a message naming the value, nothing is prepared, and the context
   still renders afterwards. */
static void range_checks(void)
{
    g_ntrace = 0, g_dumped = false;
    h3_ctx *ctx = open_ctx(1, false);
    if (!ctx) return;
    const int32_t bad32[] = {-1, INT32_MIN, INT32_MAX, 16385, 100001};
    struct { const char *name; size_t off; int32_t lo, hi; } f[] = {
        {"width", offsetof(h3_request, width), 0, 16384},
        {"height", offsetof(h3_request, height), 0, 16384},
        {"frames", offsetof(h3_request, frames), 1, 100000},
        {"steps", offsetof(h3_request, steps), 2, 1000},
        {"VAE tile", offsetof(h3_request, vae_tile_px), 0, 65536},
        {"reuse", offsetof(h3_request, reuse), 0, 1000},
        {"core reuse", offsetof(h3_request, core_reuse), 0, 1000},
        {"layers", offsetof(h3_request, layers), 0, 65536},
        {"layer policy", offsetof(h3_request, layer_policy), 0, 1},
        {"token reduction", offsetof(h3_request, token_reduction), 0, 1},
        {"render width", offsetof(h3_request, render_width), 0, 16384},
        {"LoRA file count", offsetof(h3_request, n_lora), 0, 64},
        {"reference count", offsetof(h3_request, n_references), 0, 64},
    };
    h3_render_info info;
    for (size_t i = 0; i < sizeof f / sizeof *f; i++)
        for (size_t j = 0; j < sizeof bad32 / sizeof *bad32; j++) {
            const int32_t v = bad32[j];
            if (v >= f[i].lo && v <= f[i].hi) continue;
            h3_request q;
            h3_request_default(ctx, &q);
            q.prompt = "a red dot";
            q.width = q.height = 8;
            q.steps = 3;
            memcpy((char *)&q + f[i].off, &v, sizeof v);
            char want[160];
            snprintf(want, sizeof want, "%s must be between %d and %d", f[i].name, f[i].lo, f[i].hi);
            char got_v[24];
            snprintf(got_v, sizeof got_v, "got %d", v);
            memset(&info, 0, sizeof info);
            info.struct_size = sizeof info;
            h3_err_clear();
            int rc = h3_plan(ctx, &q, &info);
            EXPECT(rc == -H3_E_INVALID && strstr(h3_last_error(), want) && strstr(h3_last_error(), got_v),
                   "h3_plan(%s = %d): rc %d, '%s' (want '%s ... %s')", f[i].name, v, rc, h3_last_error(), want, got_v);
            h3_err_clear();
            rc = h3_prepare(ctx, &q);
            EXPECT(rc == -H3_E_INVALID && strstr(h3_last_error(), want),
                   "h3_prepare(%s = %d): rc %d, '%s'", f[i].name, v, rc, h3_last_error());
            EXPECT(h3_step(ctx) < 0, "h3_step ran after a refused prepare (%s = %d)", f[i].name, v);
        }
    const float badf[] = {NAN, INFINITY, -INFINITY, -1.0f, 101.0f};
    for (size_t j = 0; j < sizeof badf / sizeof *badf; j++) {
        h3_request q;
        h3_request_default(ctx, &q);
        q.prompt = "a red dot";
        q.width = q.height = 8;
        q.cache_threshold = badf[j];
        h3_err_clear();
        EXPECT(h3_prepare(ctx, &q) == -H3_E_INVALID && strstr(h3_last_error(), "cache threshold must be between"),
               "cache threshold %g: '%s'", (double)badf[j], h3_last_error());
        const char *paths[1] = {"none.safetensors"};
        float scales[1] = {badf[j]};
        h3_request_default(ctx, &q);
        q.prompt = "a red dot";
        q.width = q.height = 8;
        q.lora_paths = paths, q.lora_scales = scales, q.n_lora = 1;
        h3_err_clear();
        int rc = h3_plan(ctx, &q, &info);
        if (isfinite(badf[j]))
            EXPECT(rc < 0 && !strstr(h3_last_error(), "scale must be"), "LoRA scale %g refused as a scale: '%s'",
                   (double)badf[j], h3_last_error());
        else
            EXPECT(rc == -H3_E_INVALID && strstr(h3_last_error(), "scale must be a finite number"),
                   "LoRA scale %g: '%s'", (double)badf[j], h3_last_error());
    }
    /* thread counts that do not fit, through h3_init */
    const int32_t badt[] = {-1, INT32_MIN, INT32_MAX, 1025};
    for (size_t j = 0; j < sizeof badt / sizeof *badt; j++) {
        h3_options o;
        h3_options_default(&o);
        o.threads = badt[j];
        o.device = H3_DEVICE_CPU;
        h3_err_clear();
        h3_ctx *c = h3_init(g_root, &o);
        EXPECT(!c && strstr(h3_last_error(), "threads must be between 0"), "h3_init(threads %d): %p '%s'", badt[j],
               (void *)c, h3_last_error());
        h3_free(c);
    }
    /* and the context still renders */
    h3_request q;
    h3_request_default(ctx, &q);
    q.prompt = "a red dot";
    q.width = q.height = 8;
    q.steps = 3;
    EXPECT(h3_prepare(ctx, &q) == 0, "prepare after the refused requests: %s", h3_last_error());
    int left;
    while ((left = h3_step(ctx)) > 0) {
    }
    EXPECT(left == 0, "steps after the refused requests: %s", h3_last_error());
    h3_free(ctx);
}

static void fixed_sequences(void)
{
    g_seq = -1;
    /* The known bug: a prepared 8x8 request, then h3_dit_denoise on a larger shape (64 video rows
       against the request's 7), then h3_step. The step must be refused, and the context must still
       render afterwards. */
    {
        g_ntrace = 0, g_dumped = false;
        shadow s = {.ctx = open_ctx(1, false)};
        if (!s.ctx) return;
        h3_request q;
        EXPECT(h3_request_default(s.ctx, &q) == 0 && q.width == 8 && q.height == 8 && q.frames == 22 &&
                   q.steps == 20 && q.seed == 42 && !q.parity,
               "h3_request_default: the fixture model's h3ctl block gives 8x8, 22 frames, 20 steps");
        q.prompt = "a red dot";
        q.width = q.height = 8;
        q.steps = 3;
        call_prepare(&s, &q);
        EXPECT(s.have, "prepare failed");
        geom g = {.n_text = 3, .T = 4, .lh = 8, .lw = 8, .Ta = 4, .valid = true, .why = "larger than the request"};
        dit_denoise(&s, &g, 3, false, true, g.why);
        call_step(&s);
        call_prepare(&s, &q);
        run_steps(&s);
        call_decode(&s, false);
        h3_free(s.ctx);
    }
    /* Same request, same bytes: on 1 and 2 threads, and with the seeded noise injected by hand. */
    {
        g_ntrace = 0, g_dumped = false;
        h3_request q;
        h3_request_default(NULL, &q);
        q.frames = 22;
        q.prompt = "on red";
        q.width = 16, q.height = 8, q.steps = 3, q.seed = 7;
        render_out a, b, c;
        int ra = full_render(1, &q, &a), rb = full_render(2, &q, &b);
        EXPECT(ra == 0 && rb == 0 && a.npx == b.npx && !memcmp(a.rgb, b.rgb, (size_t)a.npx) &&
                   !memcmp(a.pcm, b.pcm, (size_t)a.npcm * sizeof(float)),
               "renders on 1 and 2 threads differ");
        /* stream 0 = video noise [C, T, H/4, W/4], stream 1 = audio noise [2, C_a, T_a] */
        int64_t nv = (int64_t)VC * 7 * 2 * 4, na = 2LL * AC * 4;
        float *vn = xalloc((size_t)nv, sizeof(float)), *an = xalloc((size_t)na, sizeof(float));
        h3_noise_fill(q.seed, 0, 0, vn, nv);
        h3_noise_fill(q.seed, 1, 0, an, na);
        h3_parity par = {.struct_size = sizeof par, .video_noise = vn, .audio_noise = an};
        q.parity = &par, q.seed = 12345;
        int rcn = full_render(1, &q, &c);
        EXPECT(rcn == 0 && c.npx == a.npx && !memcmp(a.rgb, c.rgb, (size_t)a.npx) &&
                   !memcmp(a.pcm, c.pcm, (size_t)a.npcm * sizeof(float)),
               "injected noise differs from the seeded render");
        bool varied = false;
        for (int64_t i = 1; i < a.npx && !varied; i++) varied = a.rgb[i] != a.rgb[0];
        EXPECT(varied, "the rendered frames are constant");
        free(vn), free(an);
        free(a.rgb), free(a.pcm), free(b.rgb), free(b.pcm), free(c.rgb), free(c.pcm);
    }
    range_checks();
}

static double g_time[21];
static long g_count[21];

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* ---- main ----------------------------------------------------------------------------------- */

int main(int argc, char **argv)
{
    const char *es = getenv("H3_API_SEQ_SEED"), *ec = getenv("H3_API_SEQ_COUNT");
    g_seed = argc > 1 ? strtoull(argv[1], NULL, 0) : es ? strtoull(es, NULL, 0) : 20240611;
    long count = argc > 2 ? strtol(argv[2], NULL, 0) : ec ? strtol(ec, NULL, 0) : 10000;
    if (write_model() != 0) {
        fprintf(stderr, "cannot write the test model: %s\n", strerror(errno));
        return 1;
    }
    write_text("a_file", "not a model\n");
    g_rs = g_seed * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull;
    ctest_rng = g_seed | 1;

    fixed_sequences();

    shadow s = {0};
    long calls = 0;
    for (g_seq = 0; g_seq < count; g_seq++) {
        g_ntrace = 0;
        g_dumped = false;
        /* one context serves many sequences; a fresh one every 64 (and after an explicit free) */
        if (!s.ctx || g_seq % 64 == 0) {
            h3_free(s.ctx);
            memset(&s, 0, sizeof s);
            int threads = chance(80) ? 1 : 2;
            trace("h3_init(threads %d)", threads);
            s.ctx = open_ctx(threads, chance(10));
            if (!s.ctx) break;
            if (chance(60)) {
                s.hooked = true;
                h3_set_progress(s.ctx, on_progress, &g_prog);
            }
            sync_state(&s);
        }
        int len = 3 + rint_(10);
        for (int k = 0; k < len; k++, calls++) {
            bool left = s.have && s.info.steps_done < s.info.steps, done = s.have && !left;
            /* weights: the state decides what is likely, so renders run to the end often */
            int w[] = {/*prepare*/ s.have ? 8 : 30, /*step*/ left ? 40 : 4, /*decode*/ done ? 9 : 3, /*f32*/ 2,
                       /*info*/ 3, /*latents*/ 4, /*tokens*/ 3, /*plan*/ 6, /*text*/ 5, /*cache*/ 4, /*layout*/ 3,
                       /*forward*/ 3, /*denoise*/ 4, /*profile*/ 2, /*vdec*/ 3, /*adec*/ 2, /*json*/ 3, /*misc*/ 4,
                       /*progress*/ 3, /*init*/ 1, /*free*/ 1};
            int total = 0;
            for (size_t i = 0; i < sizeof w / sizeof *w; i++) total += w[i];
            int r = rint_(total), c = 0;
            while (r >= w[c]) r -= w[c++];
            double t0 = now_s();
            switch (c) {
            case 0: call_prepare(&s, NULL); break;
            case 1: call_step(&s); break;
            case 2: call_decode(&s, false); break;
            case 3: call_decode(&s, true); break;
            case 4: call_render_info(&s); break;
            case 5: call_get_latents(&s); break;
            case 6: call_prompt_tokens(&s); break;
            case 7: call_plan(&s); break;
            case 8: call_text_encode(&s); break;
            case 9: call_text_cache(&s); break;
            case 10: call_packed_layout(&s); break;
            case 11: call_dit_forward(&s); break;
            case 12: call_dit_denoise(&s); break;
            case 13: call_profile(&s); break;
            case 14: call_video_decode(&s); break;
            case 15: call_audio_decode(&s); break;
            case 16: call_info(&s); break;
            case 17: call_misc(&s); break;
            case 18: call_set_progress(&s); break;
            case 19: call_init_bad(); break;
            default:
                trace("h3_free");
                h3_free(s.ctx);
                memset(&s, 0, sizeof s);
                break;
            }
            g_time[c] += now_s() - t0;
            g_count[c]++;
            if (!s.ctx) break;
            sync_state(&s);
        }
    }
    if (getenv("H3_API_SEQ_PROFILE"))
        for (int c = 0; c < 21; c++) printf("  call kind %2d: %6ld calls, %.3f s\n", c, g_count[c], g_time[c]);
    h3_free(s.ctx);
    EXPECT(g_prog.bad == 0, "progress hook got bad arguments %ld times, first: %s", g_prog.bad, g_prog.bad_what);
    /* The run must have reached the states it exists to mix: a run where every render failed early
       would otherwise pass. */
    if (count >= 1000)
        CHECK_MSG(g_stat[S_PREPARED] > count / 20 && g_stat[S_STEPS] > count / 20 &&
                      g_stat[S_DECODES] > count / 100 && g_stat[S_DENOISE] > count / 100 &&
                      g_stat[S_FORWARD] > count / 200 && g_stat[S_VDEC] > count / 200 &&
                      g_stat[S_ADEC] > count / 200 && g_stat[S_CANCELLED] > count / 200 &&
                      g_stat[S_STEP_REFUSED] > 0 && g_stat[S_TEXT] > count / 200,
                  "coverage too thin");
    printf("api_seq: seed %llu, %ld sequences, %ld calls, %ld contexts: %ld prepared, %ld steps (%ld refused after "
           "a transformer call), %ld decodes, %ld video / %ld audio decodes, %ld denoise, %ld forward, %ld text "
           "encodes, %ld cancelled\n",
           g_seed, count, calls, g_stat[S_CONTEXTS], g_stat[S_PREPARED], g_stat[S_STEPS], g_stat[S_STEP_REFUSED],
           g_stat[S_DECODES], g_stat[S_VDEC], g_stat[S_ADEC], g_stat[S_DENOISE], g_stat[S_FORWARD], g_stat[S_TEXT],
           g_stat[S_CANCELLED]);
    if (getenv("H3_API_SEQ_KEEP"))
        printf("api_seq: model kept in %s\n", g_root);
    else
        remove_model();
    CTEST_END();
}
