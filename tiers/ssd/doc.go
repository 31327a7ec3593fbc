// Package ssd is the SSD tier of a peer: page slots in preallocated files,
// read and written with O_DIRECT through one io_uring.
//
// # Layout
//
// The Store owns page files orbitkv-NNN.pages in its directory, each
// preallocated (fallocate) and opened O_DIRECT. A file is carved into
// RegionBytes regions. The first Alloc of a slot size claims a free region
// (a slot larger than a region claims a run of k regions starting at a
// multiple of k) and packs it with slots of that size; a region whose last
// slot is freed returns to the free pool, so page sizes of several layouts
// share the files. A slot is one page.HeaderSize header block followed by
// the data padded to page.Alignment: SlotBytes(length).
//
// The allocator is a pure state machine (alloc.go) with no I/O; the Store
// guards it with its mutex. Because region placement is a function of the
// Locs alone, Reserving every Loc the catalog names after a restart
// rebuilds the same regions and bitmaps; nothing else is persisted here.
// A Store opened smaller than the one that wrote the files (shrink.go) says
// which catalog slots it no longer Holds and which files are Stray; it
// removes or trims nothing unless its caller decided to give those pages up.
//
// # Invariants
//
//   - Write order: the header block and the data of a page are written by
//     one writev, and under SyncBatch every touched file is fdatasynced
//     before Write returns nil for the page. Only then may the catalog name
//     the slot, so an acknowledged page is on disk before anything points
//     at it. A crash mid-write leaves a slot the catalog does not name.
//   - SyncNone gives up durability: a nil error only means the device took
//     the write; after a crash the page may be missing, stale or torn. Read
//     still never serves it: the header (own CRC) must match the expected
//     key, layout, length, generation and checksum (the caller's record,
//     not only the slot's own: a slot rewritten consistently fails), and
//     the data that CRC-32C.
//   - Every Read verifies; a failure is a *page.CorruptError for that page
//     alone, and the other pages of the call are unaffected.
//   - At most QueueDepth operations are in flight over all callers. Each
//     holds a slot ticket with its own header block; the completion queue
//     is twice the submission queue, so it never overflows.
//   - Buffers belong to the kernel from submission until the completion is
//     reaped. Read and Write never return before every operation they
//     submitted is reaped, even when ctx ends: cancellation stops new
//     submissions and fails those requests at once, but the wait for the
//     submitted ones is bounded by the device, not by ctx.
//   - Goroutines: one reaper per Store owns the completion queue; callers
//     share the submission queue under a mutex. Close stops new calls,
//     waits for running ones, stops the reaper with a NOP, then unmaps the
//     ring and closes the files. Stats().InFlight is 0 when idle.
//   - If the ring itself fails (an io_uring_enter error other than EINTR or
//     EAGAIN, never seen in practice), every operation in flight ends with
//     EIO, later calls fail the same way, and the ring is left mapped
//     rather than torn down under the reaper. The kernel may then still
//     complete an operation into a buffer already handed back; a Store in
//     that state should be closed and its pages re-verified on reopen.
//
// # Faults
//
// The Store reaches the filesystem only through Config.FS (fs.go): it
// opens the page files there, and tells each File of every page operation
// at named Points (before a write, before and after a sync, after a read).
// Tests wrap OS with WithFaults to fail, stall, tear or corrupt an
// operation at one of them; a fault is always the page's error (an errno,
// io.ErrShortWrite, io.ErrUnexpectedEOF, or a *page.CorruptError from
// verification), never a wrong byte returned as good.
package ssd
