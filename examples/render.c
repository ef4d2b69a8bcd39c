/*
 * Render a prompt with libh3 from C alone: frames as binary PPM files and the soundtrack as a
 * 16-bit stereo WAV. Only the public header is used.
 *
 *   build/render MODEL_DIR OUT_DIR "prompt" [width height frames steps seed]
 */
#include "h3.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static int on_progress(void *user, const char *phase, int done, int total)
{
    (void)user;
    fprintf(stderr, "\r%-14s %d/%d   ", phase, done, total);
    if (done == total) fputc('\n', stderr);
    return 0; /* non-zero would cancel */
}

static int write_wav(const char *path, const float *pcm, int64_t samples, int rate)
{
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    uint32_t data = (uint32_t)(samples * 4), riff = 36 + data, fmt = 16, rate_u = (uint32_t)rate,
             byte_rate = rate_u * 4;
    uint16_t pcm_fmt = 1, channels = 2, align = 4, bits = 16;
    fwrite("RIFF", 1, 4, f);
    fwrite(&riff, 4, 1, f);
    fwrite("WAVEfmt ", 1, 8, f);
    fwrite(&fmt, 4, 1, f);
    fwrite(&pcm_fmt, 2, 1, f);
    fwrite(&channels, 2, 1, f);
    fwrite(&rate_u, 4, 1, f);
    fwrite(&byte_rate, 4, 1, f);
    fwrite(&align, 2, 1, f);
    fwrite(&bits, 2, 1, f);
    fwrite("data", 1, 4, f);
    fwrite(&data, 4, 1, f);
    for (int64_t i = 0; i < samples; i++)
        for (int c = 0; c < 2; c++) { /* pcm is [2, samples]: interleave */
            float v = pcm[c * samples + i] * 32767.0f;
            v = v > 32767.0f ? 32767.0f : v < -32768.0f ? -32768.0f : v;
            int16_t s = (int16_t)(v < 0 ? v - 0.5f : v + 0.5f);
            fwrite(&s, 2, 1, f);
        }
    return fclose(f);
}

int main(int argc, char **argv)
{
    if (argc < 4) {
        fprintf(stderr, "usage: %s MODEL_DIR OUT_DIR PROMPT [width height frames steps seed]\n", argv[0]);
        return 2;
    }
    if (mkdir(argv[2], 0777) != 0 && errno != EEXIST) {
        fprintf(stderr, "error: %s: %s\n", argv[2], strerror(errno));
        return 2;
    }
    h3_ctx *ctx = h3_init(argv[1], NULL);
    if (!ctx) {
        fprintf(stderr, "error: %s\n", h3_last_error());
        return 2;
    }
    /* The model's defaults (its model_index.json), then whatever the command line gives. */
    h3_request req;
    if (h3_request_default(ctx, &req) != 0) {
        fprintf(stderr, "error: %s\n", h3_last_error());
        h3_free(ctx);
        return 2;
    }
    req.prompt = argv[3];
    if (argc > 8) {
        req.width = atoi(argv[4]);
        req.height = atoi(argv[5]);
        req.frames = atoi(argv[6]);
        req.steps = atoi(argv[7]);
        req.seed = strtoull(argv[8], NULL, 10);
    }
    h3_set_progress(ctx, on_progress, NULL);
    h3_render_info info = {.struct_size = sizeof info};
    uint8_t *rgb = NULL;
    float *pcm = NULL;
    int rc = h3_prepare(ctx, &req);
    if (rc == 0) {
        int left;
        do {
            left = h3_step(ctx); /* one Euler transition; steps left */
        } while (left > 0);
        rc = left < 0 ? left : 0;
    }
    if (rc == 0) rc = h3_render_info_get(ctx, &info);
    if (rc == 0) {
        size_t nrgb = (size_t)info.frames * info.height * info.width * 3;
        rgb = malloc(nrgb);
        pcm = malloc(sizeof(float) * 2 * (size_t)info.audio_samples);
        rc = (!rgb || !pcm) ? -1 : h3_decode(ctx, rgb, pcm);
    }
    if (rc != 0) {
        fprintf(stderr, "error: %s\n", h3_last_error());
        h3_free(ctx);
        return 2;
    }
    char path[4096];
    for (int i = 0; i < info.frames; i++) {
        snprintf(path, sizeof path, "%s/frame-%04d.ppm", argv[2], i + 1);
        FILE *f = fopen(path, "wb");
        if (!f) {
            fprintf(stderr, "error: %s: %s\n", path, strerror(errno));
            return 2;
        }
        fprintf(f, "P6\n%d %d\n255\n", info.width, info.height);
        fwrite(rgb + (size_t)i * info.height * info.width * 3, 1, (size_t)info.height * info.width * 3, f);
        fclose(f);
    }
    snprintf(path, sizeof path, "%s/audio.wav", argv[2]);
    if (write_wav(path, pcm, info.audio_samples, info.sample_rate) != 0) {
        fprintf(stderr, "error: %s: cannot write\n", path);
        return 2;
    }
    printf("%d frames %dx%d, %lld samples at %d Hz, %d steps\n", info.frames, info.width, info.height,
           (long long)info.audio_samples, info.sample_rate, info.steps);
    free(rgb);
    free(pcm);
    h3_free(ctx);
    return 0;
}
