package kvcache

import (
	"crypto/sha256"
	"encoding/binary"
)

// BlockHashes returns the chained hash of each FULL block of tokens, in
// order: with h_{-1} = parent,
//
//	h_i = first 8 bytes, big-endian, of SHA-256(h_{i-1} as 8 big-endian bytes ‖
//	      tokens[i·tpb : (i+1)·tpb], each as 4 little-endian bytes)
//
// So h_i identifies the whole prefix tokens[0 : (i+1)·tpb], not just block i:
// two requests share block i only if they agree on every token before it.
// A partial last block (len(tokens) not a multiple of tokensPerBlock) gets no
// hash and is never shared: its KV is incomplete and later tokens of its
// owner would be written into it. tokensPerBlock < 1 yields nil.
//
// parent scopes the chain: pass Layout.Hash() (or a hash of model, adapter
// and layout) so that different models never share blocks, or 0. SHA-256
// keeps deliberate collisions out of reach of a prompt author; the 64-bit
// truncation leaves accidental collisions at about n²/2^65 for n cached
// blocks.
func BlockHashes(tokens []int32, tokensPerBlock int, parent uint64) []uint64 {
	if tokensPerBlock < 1 {
		return nil
	}
	n := len(tokens) / tokensPerBlock
	if n == 0 {
		return nil
	}
	out := make([]uint64, n)
	buf := make([]byte, 8+4*tokensPerBlock)
	h := sha256.New()
	var sum [sha256.Size]byte
	prev := parent
	for i := range out {
		binary.BigEndian.PutUint64(buf, prev)
		for j, t := range tokens[i*tokensPerBlock : (i+1)*tokensPerBlock] {
			binary.LittleEndian.PutUint32(buf[8+4*j:], uint32(t))
		}
		h.Reset()
		h.Write(buf)
		prev = binary.BigEndian.Uint64(h.Sum(sum[:0]))
		out[i] = prev
	}
	return out
}

// PrefixIndex maps chained block hashes (BlockHashes) to the pool blocks
// that hold those prefixes. It holds no references: whoever inserts a block
// keeps it allocated (or pinned) while it is indexed and removes it from
// the index before freeing it. The zero value is an empty index ready to
// use. It is not safe for concurrent use.
type PrefixIndex struct {
	m map[uint64]BlockID
}

// NewPrefixIndex returns an empty index.
func NewPrefixIndex() *PrefixIndex { return &PrefixIndex{m: make(map[uint64]BlockID)} }

// Insert records that block id holds the prefix named by hash. If hash is
// already indexed the existing entry is kept (the first cached copy wins)
// and Insert returns false.
func (x *PrefixIndex) Insert(hash uint64, id BlockID) bool {
	if x.m == nil {
		x.m = make(map[uint64]BlockID)
	}
	if _, ok := x.m[hash]; ok {
		return false
	}
	x.m[hash] = id
	return true
}

// Lookup returns how many leading hashes are indexed (it stops at the first
// miss, since a later block is useless without the ones before it) and the
// blocks that hold them, in order: len(ids) == n.
func (x *PrefixIndex) Lookup(hashes []uint64) (n int, ids []BlockID) {
	for _, h := range hashes {
		id, ok := x.m[h]
		if !ok {
			break
		}
		ids = append(ids, id)
	}
	return len(ids), ids
}

// Get returns the block indexed under hash, if any.
func (x *PrefixIndex) Get(hash uint64) (BlockID, bool) {
	id, ok := x.m[hash]
	if !ok {
		return NoBlock, false
	}
	return id, true
}

// Remove drops hash from the index and reports whether it was there.
func (x *PrefixIndex) Remove(hash uint64) bool {
	if _, ok := x.m[hash]; !ok {
		return false
	}
	delete(x.m, hash)
	return true
}

// Len returns the number of indexed hashes.
func (x *PrefixIndex) Len() int { return len(x.m) }
