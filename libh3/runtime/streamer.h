/*
 * The block streamer: weights that do not stay in memory, read from their safetensors shards
 * with pread into a small ring of owned host slots by one background thread, so that item n + 1
 * (n + 2, ...) is read while item n is computed on. The CPU transformer streams its blocks with
 * it when a memory budget leaves them out (models/dit.c, h3_options.vram_bytes).
 *
 * Why pread into owned slots (the text encoder's layer reader made the same choice and measured
 * it): one large request per piece instead of a page fault per page of a cold mapping, and a peak
 * that is exactly `slots` buffers whatever the kernel does. The page cache is trusted, not
 * dropped: its pages are clean and reclaimable, and a block read again at the next step comes
 * from RAM when RAM allows (Flash-MoE's lesson).
 *
 * An item is a list of tensor spans copied to fixed offsets of a slot. The consumer opens a pass
 * with the sequence of items it will use (h3_streamer_begin), then for each one in order calls
 * h3_streamer_get (waits until it is in its slot) and h3_streamer_done (its slot may be refilled).
 * With S slots the reader stays at most S items ahead of the last item done. A pass may be left
 * unfinished (an error): the next begin waits for a read in flight, then starts over.
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
 * A streamer over the shards of `s` for `items` items; item i reads reads[i][0 .. n_reads[i]).
 * The tables are copied. slot_bytes: the largest item's extent; slots >= 1 (1: no thread, each
 * item is read by the consumer in h3_streamer_get). `what` names the weights in messages.
 */
H3_INTERNAL int h3_streamer_open(const h3_store *s, int items, const h3_stream_read *const *reads,
                                 const int *n_reads, size_t slot_bytes, int slots, const char *what,
                                 h3_streamer **out);
H3_INTERNAL void h3_streamer_close(h3_streamer *st);
/* Start a pass over `n` items (indices < items), in that order. */
H3_INTERNAL int h3_streamer_begin(h3_streamer *st, const int *seq, int n);
/* The next item of the pass in its slot (64-byte aligned; its reads at their offsets). */
H3_INTERNAL int h3_streamer_get(h3_streamer *st, const uint8_t **buf);
/* The item last returned by h3_streamer_get is no longer read: its slot may be refilled. */
H3_INTERNAL void h3_streamer_done(h3_streamer *st);
/* Bytes read since the streamer opened. */
H3_INTERNAL uint64_t h3_streamer_bytes(const h3_streamer *st);

#endif /* H3_STREAMER_H */
