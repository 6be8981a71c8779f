//go:build !amd64

package demo

import "unsafe"

// fillWords writes v + k*step into word k of the n words at p.
func fillWords(p *uint64, n int, v, step uint64) {
	if n <= 0 {
		return
	}
	for k, w := 0, unsafe.Slice(p, n); k < n; k++ {
		w[k] = v
		v += step
	}
}
