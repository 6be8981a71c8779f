//go:build !linux

package copier

import "errors"

// Self is an error here: only Linux's /proc names a process so that its
// death can be proven. Writers claim no slot and count in the shared word
// only.
func Self() (ProcessID, error) { return ProcessID{}, errors.ErrUnsupported }

// ProvenDead is false here: nothing is proven.
func ProvenDead(ProcessID) bool { return false }
