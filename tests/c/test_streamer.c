/* The block streamer (runtime/streamer.c): bytes read into the slots are the file's, in any pass order, with
   repeats, after an abandoned pass, with one slot (no thread) or several; a shard truncated under it gives one
   message naming the tensor, and the next pass works again once the file is whole. */
#include "ctest.h"
#include "core/internal.h"
#include "runtime/streamer.h"

#include <stdlib.h>
#include <unistd.h>

enum { ITEMS = 5, PER = 2, TENSORS = ITEMS * PER, N = 3000 }; /* N bytes per tensor (not a multiple of 64) */

static uint8_t byte_of(int t, int i) { return (uint8_t)(t * 37 + i * 11 + (i >> 8)); }

/* A safetensors file of TENSORS U8 tensors "t<k>" of N bytes each, in order. */
static int write_file(const char *path)
{
    char hdr[2048];
    int n = snprintf(hdr, sizeof hdr, "{");
    for (int k = 0; k < TENSORS; k++)
        n += snprintf(hdr + n, sizeof hdr - (size_t)n, "%s\"t%d\":{\"dtype\":\"U8\",\"shape\":[%d],"
                      "\"data_offsets\":[%d,%d]}", k ? "," : "", k, N, k * N, (k + 1) * N);
    n += snprintf(hdr + n, sizeof hdr - (size_t)n, "}");
    while (n % 8) hdr[n++] = ' ';
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    uint8_t len[8];
    for (int i = 0; i < 8; i++) len[i] = (uint8_t)((uint64_t)n >> (8 * i));
    fwrite(len, 1, 8, f);
    fwrite(hdr, 1, (size_t)n, f);
    for (int k = 0; k < TENSORS; k++)
        for (int i = 0; i < N; i++) fputc(byte_of(k, i), f);
    return fclose(f);
}

/* Item j: tensors 2j and 2j + 1, read in that order to slot offsets 3008 and 0. */
static const size_t DST[PER] = {3008, 0};

static int check_item(const uint8_t *buf, int item)
{
    int bad = 0;
    for (int r = 0; r < PER; r++) {
        const int t = item * PER + r;
        for (int i = 0; i < N; i++) bad += buf[DST[r] + (size_t)i] != byte_of(t, i);
    }
    return bad;
}

/* One pass over seq; returns the number of wrong bytes (or -1 on an error). */
static int run_pass(h3_streamer *st, const int *seq, int n)
{
    if (h3_streamer_begin(st, seq, n)) return -1;
    int bad = 0;
    for (int j = 0; j < n; j++) {
        const uint8_t *buf;
        if (h3_streamer_get(st, &buf)) return -1;
        bad += check_item(buf, seq[j]);
        h3_streamer_done(st);
    }
    return bad;
}

int main(void)
{
    char dir[] = "/tmp/h3_streamer_XXXXXX", path[64];
    if (!mkdtemp(dir)) return 1;
    snprintf(path, sizeof path, "%s/w.safetensors", dir);
    CHECK(write_file(path) == 0);
    h3_store s;
    memset(&s, 0, sizeof s);
    CHECK(h3_store_add_file(&s, path) == 0);

    h3_stream_read rd[ITEMS][PER];
    const h3_stream_read *reads[ITEMS];
    int n_reads[ITEMS];
    for (int j = 0; j < ITEMS; j++) {
        for (int r = 0; r < PER; r++) {
            char name[16];
            snprintf(name, sizeof name, "t%d", j * PER + r);
            rd[j][r] = (h3_stream_read){h3_store_find(&s, name), DST[r]};
            CHECK(rd[j][r].t != NULL);
        }
        reads[j] = rd[j];
        n_reads[j] = PER;
    }
    for (int slots = 1; slots <= 3; slots++) {
        h3_streamer *st = NULL;
        CHECK(h3_streamer_open(&s, ITEMS, reads, n_reads, 3008 + N, slots, "test items", &st) == 0);
        if (!st) continue;
        const int all[] = {0, 1, 2, 3, 4}, odd[] = {4, 2, 2, 0, 3, 3, 1};
        CHECK(run_pass(st, all, 5) == 0);
        CHECK(run_pass(st, odd, 7) == 0);
        /* abandoned after one item (an error in the consumer): the next pass starts over */
        const uint8_t *buf;
        CHECK(h3_streamer_begin(st, all, 5) == 0 && h3_streamer_get(st, &buf) == 0 && check_item(buf, 0) == 0);
        CHECK(run_pass(st, odd, 7) == 0);
        /* a pass longer than the item count grows the sequence */
        int longer[12];
        for (int i = 0; i < 12; i++) longer[i] = (i * 3) % ITEMS;
        CHECK(run_pass(st, longer, 12) == 0);
        CHECK(h3_streamer_bytes(st) > 0 && h3_streamer_bytes(st) % N == 0);
        /* misuse: an item out of range, a get past the pass */
        const int bad_item[] = {5};
        CHECK(h3_streamer_begin(st, bad_item, 1) != 0 && strstr(h3_last_error(), "test items: item 5 of 5"));
        CHECK(run_pass(st, all, 1) == 0);
        CHECK(h3_streamer_get(st, &buf) != 0 && strstr(h3_last_error(), "every item of the pass was read"));
        /* the shard truncated under the streamer: one message naming the tensor; whole again: reads again */
        CHECK(truncate(path, 8 + 4096) == 0);
        CHECK(run_pass(st, all, 5) == -1);
        CHECK_MSG(strstr(h3_last_error(), "cannot read tensor 't") && strstr(h3_last_error(), "file truncated"), "%s",
                  h3_last_error());
        CHECK(write_file(path) == 0);
        CHECK(run_pass(st, all, 5) == 0);
        h3_streamer_close(st);
    }
    /* a slot too small for an item's reads is refused at open */
    h3_streamer *st = NULL;
    CHECK(h3_streamer_open(&s, ITEMS, reads, n_reads, 3008, 2, "test items", &st) != 0 && !st);
    CHECK(strstr(h3_last_error(), "does not fit its slot") != NULL);
    h3_store_close(&s);
    unlink(path);
    rmdir(dir);
    printf("%d checks, %d failures\n", ctest_checks, ctest_failures);
    return ctest_failures != 0;
}
