//go:build !unix

package host

// ProcessGone reports whether no process pid exists; false (unknown) where
// it cannot be asked.
func ProcessGone(int) bool { return false }
