/*
 * A stand-in for libnvrtc.so.13 (tests/test_cuda_faults.py, through H3_NVRTC_LIB): the entry points
 * cuda_driver.h's H3_NVRTC_FUNCS lists, with NVRTC's signatures and result codes. A "compile" takes
 * no time and yields an image the fake driver accepts: "FAKECUBIN <file> <-arch option>\n" and the
 * source's length, so the kernel cache has real, distinct bytes to keep; a kernel's lowered name is
 * its name expression.
 *   H3_FAKE_NVRTC=fail        nvrtcCompileProgram returns NVRTC_ERROR_COMPILATION with a two-line log
 *   H3_FAKE_NVRTC_LOG=file    one line appended per compile ("compile <file> <-arch option>")
 */
#define _POSIX_C_SOURCE 200809L /* strdup */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define API __attribute__((visibility("default")))

typedef int nvrtcResult;
enum { NVRTC_SUCCESS = 0, NVRTC_ERROR_INVALID_INPUT = 3, NVRTC_ERROR_INVALID_PROGRAM = 4, NVRTC_ERROR_COMPILATION = 6,
       NVRTC_ERROR_NAME_EXPRESSION_NOT_VALID = 10 };

#define MAX_NAMES 256

typedef struct {
    char name[128];
    size_t src_len;
    char *names[MAX_NAMES];
    int n_names;
    char image[512];
    char log[512];
    int compiled;
} Prog;

API const char *nvrtcGetErrorString(nvrtcResult r)
{
    switch (r) {
    case NVRTC_SUCCESS: return "NVRTC_SUCCESS";
    case NVRTC_ERROR_INVALID_INPUT: return "NVRTC_ERROR_INVALID_INPUT";
    case NVRTC_ERROR_INVALID_PROGRAM: return "NVRTC_ERROR_INVALID_PROGRAM";
    case NVRTC_ERROR_COMPILATION: return "NVRTC_ERROR_COMPILATION";
    case NVRTC_ERROR_NAME_EXPRESSION_NOT_VALID: return "NVRTC_ERROR_NAME_EXPRESSION_NOT_VALID";
    default: return "NVRTC_ERROR unknown";
    }
}

API nvrtcResult nvrtcVersion(int *major, int *minor)
{
    *major = 13;
    *minor = 0;
    return NVRTC_SUCCESS;
}

API nvrtcResult nvrtcCreateProgram(Prog **out, const char *src, const char *name, int nh, const char *const *headers,
                                   const char *const *include_names)
{
    (void)headers, (void)include_names;
    if (!out || !src || nh < 0) return NVRTC_ERROR_INVALID_INPUT;
    Prog *p = calloc(1, sizeof *p);
    if (!p) return NVRTC_ERROR_INVALID_INPUT;
    snprintf(p->name, sizeof p->name, "%s", name ? name : "default_program");
    p->src_len = strlen(src);
    *out = p;
    return NVRTC_SUCCESS;
}

API nvrtcResult nvrtcDestroyProgram(Prog **p)
{
    if (!p || !*p) return NVRTC_ERROR_INVALID_PROGRAM;
    for (int i = 0; i < (*p)->n_names; i++) free((*p)->names[i]);
    free(*p);
    *p = NULL;
    return NVRTC_SUCCESS;
}

API nvrtcResult nvrtcAddNameExpression(Prog *p, const char *expr)
{
    if (!p || !expr || p->n_names == MAX_NAMES) return NVRTC_ERROR_INVALID_INPUT;
    p->names[p->n_names++] = strdup(expr);
    return NVRTC_SUCCESS;
}

API nvrtcResult nvrtcCompileProgram(Prog *p, int n, const char *const *opts)
{
    if (!p) return NVRTC_ERROR_INVALID_PROGRAM;
    const char *arch = "";
    for (int i = 0; i < n; i++)
        if (!strncmp(opts[i], "-arch=", 6)) arch = opts[i];
    const char *logf = getenv("H3_FAKE_NVRTC_LOG");
    if (logf && *logf) {
        FILE *f = fopen(logf, "a");
        if (f) {
            fprintf(f, "compile %s %s\n", p->name, arch);
            fclose(f);
        }
    }
    const char *m = getenv("H3_FAKE_NVRTC");
    if (m && !strcmp(m, "fail")) {
        snprintf(p->log, sizeof p->log,
                 "%s(1): error: the test double of NVRTC refuses to compile\n1 error detected in the compilation of "
                 "\"%s\".\n",
                 p->name, p->name);
        return NVRTC_ERROR_COMPILATION;
    }
    snprintf(p->image, sizeof p->image, "FAKECUBIN %s %s %zu\n", p->name, arch, p->src_len);
    p->compiled = 1;
    return NVRTC_SUCCESS;
}

API nvrtcResult nvrtcGetCUBINSize(Prog *p, size_t *n)
{
    if (!p || !p->compiled) return NVRTC_ERROR_INVALID_PROGRAM;
    *n = strlen(p->image) + 1;
    return NVRTC_SUCCESS;
}

API nvrtcResult nvrtcGetCUBIN(Prog *p, char *out)
{
    if (!p || !p->compiled) return NVRTC_ERROR_INVALID_PROGRAM;
    memcpy(out, p->image, strlen(p->image) + 1);
    return NVRTC_SUCCESS;
}

API nvrtcResult nvrtcGetProgramLogSize(Prog *p, size_t *n)
{
    if (!p) return NVRTC_ERROR_INVALID_PROGRAM;
    *n = strlen(p->log) + 1;
    return NVRTC_SUCCESS;
}

API nvrtcResult nvrtcGetProgramLog(Prog *p, char *out)
{
    if (!p) return NVRTC_ERROR_INVALID_PROGRAM;
    memcpy(out, p->log, strlen(p->log) + 1);
    return NVRTC_SUCCESS;
}

API nvrtcResult nvrtcGetLoweredName(Prog *p, const char *expr, const char **low)
{
    if (!p || !p->compiled) return NVRTC_ERROR_INVALID_PROGRAM;
    for (int i = 0; i < p->n_names; i++)
        if (!strcmp(p->names[i], expr)) {
            *low = p->names[i];
            return NVRTC_SUCCESS;
        }
    return NVRTC_ERROR_NAME_EXPRESSION_NOT_VALID;
}
