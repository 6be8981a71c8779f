//go:build !race

package sim

// defaultSeeds is TestSeeds' seed count without the race detector.
const defaultSeeds = 2000
