// Package catalog is the peer's index of the pages it holds: one Entry per
// page key, a longest-prefix Lookup over a chain of keys, and Pebble
// persistence for the pages that live on SSD so that they are found again
// after a restart (DESIGN.md §3, §6 "catalog" and "recovery").
//
// # Invariants
//
//   - An entry names SSD bytes (OnSSD, SSD) only after the SSD tier has made
//     those bytes durable. The catalog cannot check this; it is the caller's
//     order: write and sync the page, then Put the entry. Conversely, remove
//     the SSD location from the catalog (Put without OnSSD, Update or Delete)
//     before the SSD space is reused.
//   - Put, Update and Delete commit one Pebble batch (synced unless
//     Options.NoSync, or unless it changes only LastAccess, Hits or DRAM
//     copies: a crash may lose such a commit, a clean Close does not)
//     before the in-memory index changes. If a commit that
//     writes records fails, memory is unchanged and the error is returned
//     (ErrNoSpace below Options.ReserveBytes or on ENOSPC, ErrUnavailable
//     with a failed store). A commit that only deletes records never fails
//     for persistence: memory changes, and a failed store is rewritten from
//     memory by Repair. Writers are serialized, so the persisted state and
//     the in-memory state change in the same order. Repair writes the fresh
//     store without the writer lock (writers go on as with a failed store)
//     and, under it, writes the keys changed meanwhile again before
//     installing it.
//   - Pebble never ends the process (pebble.go): its Fatalf and
//     DataCorruption handlers are replaced. A store Open cannot read is
//     moved into Dir/corrupt-<time>/ and replaced by an empty one
//     (Stats().Damage); a store that cannot be opened for want of space or
//     permission leaves the catalog in memory only until Repair. The
//     persisted catalog is an index the caller can rebuild (the fabric
//     rebuilds it from the SSD slot headers at every start), never the only
//     copy of anything.
//   - Only entries with OnSSD are persisted. DRAM is lost with the process, so
//     Open recovers every persisted entry with DRAMSlot = -1: after a restart
//     the catalog holds exactly the SSD-resident pages.
//   - A persisted record carries a version byte and a CRC-32C over its key and
//     value. A record that fails to decode is skipped at Open and counted in
//     Stats().CorruptRecords; it never becomes an entry and never crashes the
//     peer.
//   - LastAccess and Hits are touched by Lookup in memory only; the persisted
//     copies are those of the last Put/Update that reached the disk.
//   - Pebble types never leave this package.
//
// # Index
//
// The in-memory index is 256 shards, each an open-addressing table (linear
// probing, backward-shift deletion) of 88-byte cells: the 16-byte key with
// its record inline, no pointers, so the garbage collector never scans it
// and a probe that finds a key has its record in the same cache lines.
// Keys are placed by a per-process seeded hash (keys come from clients and
// must not be able to pile into one probe sequence). Layout fingerprints
// are interned into a small table and a record stores a 4-byte id. Tables
// grow by half at 80% load, so the index costs about 110-130 bytes per
// entry (10 M entries ≈ 1.1 GiB). Each shard has its own RWMutex.
//
// Lookup probes a chain in chunks of 32 keys: it hashes the chunk, read-locks
// its shards in increasing order (the only place several shard locks are
// held; writers hold one at a time, so no deadlock), loads every key's home
// cell so the cache misses overlap, then walks the chain and stops at the
// first absent page.
//
// # Change feed
//
// Options.OnChange, when set, is called after every committed change, in
// commit order, saying whether the key was Added, Updated or Deleted. It is
// the hook for gossiping catalog changes to other peers.
//
// # Remote index
//
// Remote (remote.go) is what this peer has heard of other peers' pages:
// per key, its layout, size and the set of peers that announced it. It is
// filled by the fabric's gossip, never persisted (a restarted peer asks the
// others again), and extends a local Lookup with pages held elsewhere.
//
// # Summaries
//
// Summary (summary.go) is a blocked Bloom filter of a peer's own page keys
// with a saturating count per bit, so that a removal clears only the bits
// no other page sets; Add and Remove return the bits they changed, which
// the fabric gossips. Summaries holds the filters other peers published,
// by origin. Bit positions depend on the key and the filter's size only,
// so every peer computes the same ones. A filter never misses a page its
// owner holds (a saturated bit stays set); it may claim one it does not
// (about 15% per key at capacity, 4 bits a page): whoever acts on a claim
// asks the owner first.
package catalog
