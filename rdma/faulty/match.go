package faulty

import (
	"math/rand/v2"
	"slices"
)

// Match picks the batches a fault hits: seq is the batch's number on its
// endpoint (from 0), r the endpoint's seeded random stream.
type Match func(seq uint64, r *rand.Rand) bool

// Nth matches the batches numbered seqs.
func Nth(seqs ...uint64) Match {
	s := slices.Clone(seqs)
	return func(seq uint64, _ *rand.Rand) bool { return slices.Contains(s, seq) }
}

// From matches batch first and every batch after it.
func From(first uint64) Match {
	return func(seq uint64, _ *rand.Rand) bool { return seq >= first }
}

// Always matches every batch.
func Always() Match {
	return func(uint64, *rand.Rand) bool { return true }
}

// Rate matches each batch with probability p, drawing one number from the
// endpoint's stream each time it is tried.
func Rate(p float64) Match {
	return func(_ uint64, r *rand.Rand) bool { return r.Float64() < p }
}
