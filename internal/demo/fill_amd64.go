package demo

// fillWords writes v + k*step into word k of the n words at p, with
// stores that bypass the cache (fill_amd64.s).
//
//go:noescape
func fillWords(p *uint64, n int, v, step uint64)
