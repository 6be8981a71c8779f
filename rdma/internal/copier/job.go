package copier

import "github.com/kvxfer/kvxfer/kvcache"

// Job is one accepted batch as the copier runs it: copy every segment from
// Src to Dst (whole regions; segment offsets are relative to them), release
// the leases, then call Done.
type Job struct {
	Src, Dst []byte
	Segs     []kvcache.Segment
	// Done gets the outcome; nil is allowed.
	Done func(err error)
	// Leases are released (nil entries skipped) just before Done is called,
	// so that a region is free again by the time its batch is reported.
	Leases [2]*Lease

	flush bool // a Flush marker: no copy, Done(nil) in its place in order
}

func (j *Job) release() {
	for _, l := range j.Leases {
		if l != nil {
			l.Release()
		}
	}
}

func (j *Job) complete(err error) {
	j.release()
	if j.Done != nil {
		j.Done(err)
	}
}
