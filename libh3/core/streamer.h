/*
 * The streamer: weights that do not stay in memory, read from their safetensors shards with
 * pread into a small ring of host slots by one background thread, so that item n + 1 (n + 2, ...)
 * is read while item n is computed on. It is libh3's one weight reader: the CPU transformer
 * streams its blocks with it when a memory budget leaves them out (models/dit_stream.c,
 * h3_options.vram_bytes), and the text encoder its decoder layers (models/text_encoder.c; on a
 * GPU into the pinned buffers of the backend's weight stream, several threads per layer).
 *
 * Why pread and not mmap + MADV_WILLNEED: a text-encoder layer of the release is ~930 MiB read
 * once per encode. pread hands the kernel one large request per piece, while a cold mapping
 * faults page by page (Flash-MoE measured mmap ~5x slower than pread for cold multi-MB blobs).
 * Slots also make the peak exact: `slots` buffers, reused, whatever the kernel does, and no
 * mapping of a 60+ GB shard set stays around. The price is one memory-bandwidth copy per item
 * out of the page cache. Measured on a 2-core box with a header-true full-size checkpoint (text
 * encoder, 4 of 64 layers): peak RSS +1861 MiB with 2 slots and +931 MiB with 1; steady-state
 * layers ~1.0 s with prefetch against ~1.5 s without, while a fresh slot pays ~1.5 s of page
 * faults on first use. Huge pages (MADV_HUGEPAGE) made that first touch slower (synchronous
 * compaction under THP "madvise" defrag), so owned slots are plain aligned allocations.
 * The page cache is trusted, not dropped (no POSIX_FADV_DONTNEED): its pages are clean and
 * reclaimable, so they never raise the committed peak, and an item read again (the next step,
 * the next prompt) comes from RAM when RAM allows (Flash-MoE's lesson); the phase-end
 * h3_store_release is the place that drops it explicitly.
 *
 * An item is a list of tensor spans copied to fixed offsets of a slot. The consumer opens a pass
 * with the sequence of items it will use (h3_streamer_begin), then for each one in order calls
 * h3_streamer_get (waits until it is in its slot) and h3_streamer_done (the oldest item not yet
 * done no longer needs its slot: a GPU calls it once the copy out of the slot is over, which may
 * be after the next get). With S slots the reader stays at most S items ahead of the last item
 * done. A pass may be left unfinished (an error): the next begin waits for a read in flight,
 * then starts over. Which thread reads, and how many, never changes the bytes of a slot.
 */
#ifndef H3_STREAMER_H
#define H3_STREAMER_H

#include "core/internal.h"

#include <stddef.h>
#include <stdint.h>

/* One tensor span read into a slot: `bytes` bytes of `t` (from its start) to slot offset `dst`. */
typedef struct h3_stream_read {
    const h3_tensor *t;
    size_t dst;
} h3_stream_read;

typedef struct h3_streamer h3_streamer;

/*
 * A streamer over the shards of `s` for `items` items; item i reads reads[i][0 .. n_reads[i]), in
 * that order (sort them by shard and offset for one sequential stream per shard). The tables are
 * copied. slot_bytes: the largest item's extent; slots >= 1 (1: no thread, each item is read by
 * the consumer in h3_streamer_get), position k of a pass lands in slot k % slots.
 * ext: NULL (the streamer allocates its slots) or `slots` caller buffers of slot_bytes, 64-byte
 * aligned, that outlive the streamer (a GPU's pinned staging buffers). readers >= 1: threads that
 * read one item together, each pulling the next piece of it (one thread copying out of the page
 * cache moves ~5-10 GB/s, below what PCIe takes). `what` names the weights in messages.
 */
H3_INTERNAL int h3_streamer_open(const h3_store *s, int items, const h3_stream_read *const *reads,
                                 const int *n_reads, size_t slot_bytes, int slots, void *const *ext,
                                 int readers, const char *what, h3_streamer **out);
H3_INTERNAL void h3_streamer_close(h3_streamer *st);
/* Start a pass over `n` items (indices < items), in that order. */
H3_INTERNAL int h3_streamer_begin(h3_streamer *st, const int *seq, int n);
/* The next item of the pass in its slot (64-byte aligned; its reads at their offsets). */
H3_INTERNAL int h3_streamer_get(h3_streamer *st, const uint8_t **buf);
/* The oldest item returned by h3_streamer_get and not yet done is no longer read: its slot may
   be refilled. */
H3_INTERNAL void h3_streamer_done(h3_streamer *st);
/* The slot count (position k of a pass is in slot k % slots). */
H3_INTERNAL int h3_streamer_slots(const h3_streamer *st);
/* A synchronous read by the caller of `len` bytes of tensor t from `skip` bytes into it (rows of an
   embedding table), through the streamer's descriptors; counted in h3_streamer_bytes. */
H3_INTERNAL int h3_streamer_read(h3_streamer *st, const h3_tensor *t, uint64_t skip, uint64_t len, void *dst);
/* Bytes read since the streamer opened. */
H3_INTERNAL uint64_t h3_streamer_bytes(const h3_streamer *st);

#endif /* H3_STREAMER_H */
