package meminfo

import "testing"

func TestParseAvailable(t *testing.T) {
	for _, c := range []struct {
		in   string
		want uint64
		ok   bool
	}{
		{"MemTotal:       24000000 kB\nMemFree:  100 kB\nMemAvailable:   23000000 kB\n", 23000000 << 10, true},
		{"MemTotal:       24000000 kB\n", 0, false},
		{"MemAvailable:   x kB\n", 0, false},
		{"MemAvailable:   12 MB\n", 0, false},
		{"MemAvailable:   99999999999999999999 kB\n", 0, false},
	} {
		if got, ok := parseAvailable([]byte(c.in)); got != c.want || ok != c.ok {
			t.Errorf("parseAvailable(%q) = %d, %v; want %d, %v", c.in, got, ok, c.want, c.ok)
		}
	}
}
