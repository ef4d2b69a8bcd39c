/* The streamer (core/streamer.c): bytes read into the slots are the file's, in any pass order, with
   repeats, after an abandoned pass, with one slot (no thread) or several, owned or caller slots, one reader
   or several per item (pieces smaller than a tensor); a slot is not refilled before its item is done (a GPU
   marks an item done one get later); a caller's partial read of a tensor, also from a shard no item reads;
   a shard truncated under it gives one message naming the tensor, and the next pass works again once the
   file is whole; bad arguments are refused with a message. */
#include "ctest.h"
#include "core/internal.h"
#include "core/streamer.h"

#include <stdlib.h>
#include <unistd.h>

/* N bytes per tensor: not a multiple of 64, and over two of the 4 KiB pieces of a parallel read */
enum { ITEMS = 5, PER = 2, TENSORS = ITEMS * PER, N = 10000, N64 = 10048 };

static uint8_t byte_of(int t, int i) { return (uint8_t)(t * 37 + i * 11 + (i >> 8)); }

/* A safetensors file of TENSORS U8 tensors "<prefix><k>" of N bytes each, in order. */
static int write_file(const char *path, const char *prefix)
{
    char hdr[2048];
    int n = snprintf(hdr, sizeof hdr, "{");
    for (int k = 0; k < TENSORS; k++)
        n += snprintf(hdr + n, sizeof hdr - (size_t)n, "%s\"%s%d\":{\"dtype\":\"U8\",\"shape\":[%d],"
                      "\"data_offsets\":[%d,%d]}", k ? "," : "", prefix, k, N, k * N, (k + 1) * N);
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

/* Item j: tensors 2j and 2j + 1, read in that order to slot offsets N64 and 0. */
static const size_t DST[PER] = {N64, 0};

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

/* The GPU's order: item k is done only after item k + 1 was got; the earlier slot must hold its item until
   then (with 2+ slots). */
static int run_lagged(h3_streamer *st, const int *seq, int n)
{
    if (h3_streamer_begin(st, seq, n)) return -1;
    int bad = 0;
    const uint8_t *prev = NULL;
    for (int j = 0; j < n; j++) {
        const uint8_t *buf;
        if (h3_streamer_get(st, &buf)) return -1;
        if (prev) {
            usleep(2000); /* time for a reader that ignored the protocol to overwrite prev */
            bad += check_item(prev, seq[j - 1]);
            h3_streamer_done(st);
        }
        bad += check_item(buf, seq[j]);
        prev = buf;
    }
    return bad;
}

static void check_reads(h3_streamer *st, const h3_store *s)
{
    /* a caller's read of part of a tensor, in the items' shard and in one no item reads */
    uint8_t got[1000];
    const uint64_t before = h3_streamer_bytes(st);
    const h3_tensor *t3 = h3_store_find(s, "t3"), *u7 = h3_store_find(s, "u7");
    CHECK(t3 && u7);
    if (!t3 || !u7) return;
    int bad = 0;
    CHECK(h3_streamer_read(st, t3, 100, 500, got) == 0);
    for (int i = 0; i < 500; i++) bad += got[i] != byte_of(3, 100 + i);
    CHECK(h3_streamer_read(st, u7, N - 1000, 1000, got) == 0);
    for (int i = 0; i < 1000; i++) bad += got[i] != byte_of(7, N - 1000 + i);
    CHECK(bad == 0);
    CHECK(h3_streamer_bytes(st) == before + 1500);
    CHECK(h3_streamer_read(st, u7, N - 1000, 1001, got) != 0 && strstr(h3_last_error(), "outside tensor 'u7'"));
}

int main(void)
{
    char dir[] = "/tmp/h3_streamer_XXXXXX", path[64], other[64];
    if (!mkdtemp(dir)) return 1;
    snprintf(path, sizeof path, "%s/w.safetensors", dir);
    snprintf(other, sizeof other, "%s/u.safetensors", dir);
    CHECK(write_file(path, "t") == 0 && write_file(other, "u") == 0);
    h3_store s;
    memset(&s, 0, sizeof s);
    CHECK(h3_store_add_file(&s, path) == 0 && h3_store_add_file(&s, other) == 0);

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
    uint8_t *ext[3];
    for (int i = 0; i < 3; i++) ext[i] = h3_alloc_aligned(N64 + N);
    for (int cfg = 0; cfg < 12; cfg++) {
        const int slots = 1 + cfg % 3, readers = cfg / 3 % 2 ? 3 : 1, caller = cfg / 6;
        h3_streamer *st = NULL;
        for (int i = 0; i < 3; i++) memset(ext[i], 0xAA, N64 + N);
        CHECK_MSG(h3_streamer_open(&s, ITEMS, reads, n_reads, N64 + N, slots, caller ? (void *const *)ext : NULL,
                                   readers, "test items", &st) == 0, "%s", h3_last_error());
        if (!st) continue;
        CHECK(h3_streamer_slots(st) == slots);
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
        if (slots > 1) CHECK(run_lagged(st, longer, 12) == 0);
        if (caller) /* the items landed in the caller's buffers */
            CHECK(run_pass(st, all, 1) == 0 && h3_streamer_begin(st, all, 1) == 0 && h3_streamer_get(st, &buf) == 0 &&
                  buf == ext[0]);
        check_reads(st, &s);
        /* misuse: an item out of range, a get past the pass */
        const int bad_item[] = {5};
        CHECK(h3_streamer_begin(st, bad_item, 1) != 0 && strstr(h3_last_error(), "test items: item 5 of 5"));
        CHECK(run_pass(st, all, 1) == 0);
        CHECK(h3_streamer_get(st, &buf) != 0 && strstr(h3_last_error(), "every item of the pass was read"));
        /* the shard truncated under the streamer: one message naming the tensor; whole again: reads again */
        CHECK(truncate(path, 8 + 4096 * 3) == 0);
        CHECK(run_pass(st, all, 5) == -1);
        CHECK_MSG(strstr(h3_last_error(), "cannot read tensor 't") && strstr(h3_last_error(), "file truncated"), "%s",
                  h3_last_error());
        CHECK(write_file(path, "t") == 0);
        CHECK(run_pass(st, all, 5) == 0);
        h3_streamer_close(st);
    }
    /* the caller's slots outlive the streamer (not freed by it: ASan would see the double free) */
    for (int i = 0; i < 3; i++) h3_free_aligned(ext[i]);
    /* a slot too small for an item's reads, bad slot or reader counts, an unaligned caller slot: refused */
    h3_streamer *st = NULL;
    CHECK(h3_streamer_open(&s, ITEMS, reads, n_reads, N64, 2, NULL, 1, "test items", &st) != 0 && !st);
    CHECK(strstr(h3_last_error(), "does not fit its slot") != NULL);
    CHECK(h3_streamer_open(&s, ITEMS, reads, n_reads, N64 + N, 2, NULL, 0, "test items", &st) != 0 && !st);
    CHECK(strstr(h3_last_error(), "test items: a streamer of 5 items, 2 slots and 0 readers") != NULL);
    CHECK(h3_streamer_open(&s, ITEMS, reads, n_reads, N64 + N, 9, NULL, 1, "test items", &st) != 0 && !st);
    CHECK(strstr(h3_last_error(), "9 slots") != NULL);
    uint8_t *al = h3_alloc_aligned(N64 + N + 64);
    void *odd_slots[2] = {al, al + 1};
    CHECK(h3_streamer_open(&s, ITEMS, reads, n_reads, N64 + N, 2, odd_slots, 1, "test items", &st) != 0 && !st);
    CHECK(strstr(h3_last_error(), "caller slot 1 is NULL or not 64-byte aligned") != NULL);
    h3_free_aligned(al);
    h3_store_close(&s);
    unlink(path);
    unlink(other);
    rmdir(dir);
    printf("%d checks, %d failures\n", ctest_checks, ctest_failures);
    return ctest_failures != 0;
}
