//go:build race

package sim

// defaultSeeds is TestSeeds' seed count under the race detector (CI runs
// this many with -race, beside the full count without).
const defaultSeeds = 200
