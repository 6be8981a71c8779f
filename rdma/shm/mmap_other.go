//go:build !linux

package shm

import (
	"errors"
	"os"
)

func mapFile(*os.File, int) ([]byte, error) {
	return nil, errors.ErrUnsupported
}

func unmapFile([]byte) error { return errors.ErrUnsupported }

func reserveFile(*os.File, int) error { return errors.ErrUnsupported }

const openNoFollow = 0

func mapFixed(*os.File, uintptr, int, int64, bool) error { return errors.ErrUnsupported }

func holdFile(*os.File) (bool, error) { return true, nil }

func fileHeld(string) (bool, error) { return false, errors.ErrUnsupported }

func removeUnheld(string) (bool, error) { return false, errors.ErrUnsupported }
