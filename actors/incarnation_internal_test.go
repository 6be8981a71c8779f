package actors

import (
	"testing"
	"time"
)

// TestNextIncarnationOutlivesAClockStep: an engine opened after the clock
// stepped back an hour still gets a later incarnation than the one before
// it in this process. (Checked to fail: with the wall clock alone, the
// second incarnation was an hour's nanoseconds below the first.)
func TestNextIncarnationOutlivesAClockStep(t *testing.T) {
	now := time.Now()
	first := nextIncarnation(now)
	second := nextIncarnation(now.Add(-time.Hour))
	third := nextIncarnation(now.Add(-time.Hour))
	if second <= first || third <= second {
		t.Fatalf("incarnations %d, %d, %d after the clock stepped back: want each above the one before", first, second, third)
	}
}
