//go:build !kvxfer_invariants

package sim

// mutations is empty in a default build: actors.Mutations exists only with
// the kvxfer_invariants tag (make test, make sim).
var mutations []struct {
	name string
	on   *bool
}
