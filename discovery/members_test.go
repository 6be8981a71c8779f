package discovery

import (
	"errors"
	"fmt"
	"testing"
)

// The membership table alone, without etcd: what each stored change
// yields.

func enc(t *testing.T, r Record, state string) []byte {
	t.Helper()
	b, err := r.encode(state)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func kinds(evs []Event) string { return fmt.Sprint(evs) }

func TestMembersLifecycle(t *testing.T) {
	m := newMembers("c")
	k := Key("c", "gen", 1)
	steps := []struct {
		name string
		do   func() []Event
		want string
	}{
		{"up 5", func() []Event { return m.put(k, enc(t, testRecord("gen", 1, 5), stateUp), 1) }, "[UP gen/1#5]"},
		{"same again", func() []Event { return m.put(k, enc(t, testRecord("gen", 1, 5), stateUp), 1) }, "[]"},
		{"older", func() []Event { return m.put(k, enc(t, testRecord("gen", 1, 4), stateUp), 1) }, "[REJECTED"},
		{"newer supersedes", func() []Event { return m.put(k, enc(t, testRecord("gen", 1, 6), stateUp), 2) },
			"[DOWN gen/1#5: superseded by incarnation 6 UP gen/1#6]"},
		{"expiry", func() []Event { return m.del(k) }, "[DOWN gen/1#6: lease expired]"},
		{"delete again", func() []Event { return m.del(k) }, "[]"},
		{"dead one back", func() []Event { return m.put(k, enc(t, testRecord("gen", 1, 6), stateUp), 3) }, "[REJECTED"},
		{"up 7", func() []Event { return m.put(k, enc(t, testRecord("gen", 1, 7), stateUp), 3) }, "[UP gen/1#7]"},
		{"leaves", func() []Event { return m.put(k, enc(t, testRecord("gen", 1, 7), stateLeaving), 3) }, "[DOWN gen/1#7: left]"},
		{"revoked after leaving", func() []Event { return m.del(k) }, "[]"},
		{"leaving seen again", func() []Event { return m.put(k, enc(t, testRecord("gen", 1, 7), stateLeaving), 3) }, "[]"},
		{"never-up leaving", func() []Event { return m.put(k, enc(t, testRecord("gen", 1, 9), stateLeaving), 3) }, "[]"},
		{"below it", func() []Event { return m.put(k, enc(t, testRecord("gen", 1, 8), stateUp), 3) }, "[REJECTED"},
	}
	for _, s := range steps {
		got := kinds(s.do())
		if len(got) < len(s.want) || got[:len(s.want)] != s.want {
			t.Fatalf("%s: %s, want %s", s.name, got, s.want)
		}
	}
	if m.rejected != 3 {
		t.Errorf("rejected %d, want 3", m.rejected)
	}
}

func TestMembersRejectsWithoutState(t *testing.T) {
	m := newMembers("c")
	good := enc(t, testRecord("gen", 1, 5), stateUp)
	changed := testRecord("gen", 1, 5)
	changed.ControlEndpoint = "tcp://elsewhere:1"
	cases := []struct {
		key   string
		value []byte
		lease int64
		want  error
	}{
		{Key("c", "gen", 1), []byte("garbage"), 1, ErrInvalidRecord},
		{Key("c", "gen", 1), good, 0, ErrInvalidRecord},     // no lease
		{Key("c", "gen", 2), good, 1, ErrInvalidRecord},     // another rank's key
		{Key("other", "gen", 1), good, 1, ErrInvalidRecord}, // another cluster
		{"/kvxfer/c/gen", good, 1, ErrInvalidRecord},        // no rank
		{"/kvxfer/c/gen/01", good, 1, ErrInvalidRecord},     // not canonical
		{"/kvxfer/c/gen/1/x", good, 1, ErrInvalidRecord},    // too deep
		{"/kvxfer/c/gen/-1", good, 1, ErrInvalidRecord},     // negative
		{"/kvxfer/c/gen/65536", good, 1, ErrInvalidRecord},  // too large
		{"/kvxfer/c/g\x00n/1", good, 1, ErrInvalidRecord},   // unprintable
	}
	for _, c := range cases {
		evs := m.put(c.key, c.value, c.lease)
		if len(evs) != 1 || evs[0].Kind != EventRejected || evs[0].Key != c.key || !errors.Is(evs[0].Err, c.want) {
			t.Errorf("%q: %v, want one rejection (%v) naming the key", c.key, evs, c.want)
		}
	}
	if len(m.ranks) != 0 {
		t.Errorf("rejected values created state: %v", m.ranks)
	}
	m.put(Key("c", "gen", 1), good, 1)
	evs := m.put(Key("c", "gen", 1), enc(t, changed, stateUp), 1)
	if len(evs) != 1 || evs[0].Kind != EventRejected || !errors.Is(evs[0].Err, ErrInvalidRecord) {
		t.Errorf("record changed within an incarnation: %v, want a rejection", evs)
	}
	if p := m.peers(); len(p) != 1 || p[0].ControlEndpoint != testRecord("gen", 1, 5).ControlEndpoint {
		t.Errorf("peers %v: want the first record kept", p)
	}
}

func TestMembersSelf(t *testing.T) {
	m := newMembers("c")
	k := Key("c", "ctx", 0)
	// An earlier run of this rank is still registered: a peer until it goes.
	if evs := m.put(k, enc(t, testRecord("ctx", 0, 3), stateUp), 1); kinds(evs) != "[UP ctx/0#3]" {
		t.Fatalf("old self: %v", evs)
	}
	if err := m.register(testRecord("ctx", 0, 3)); !errors.Is(err, ErrStaleIncarnation) {
		t.Fatalf("register at a seen incarnation: %v", err)
	}
	if err := m.register(testRecord("ctx", 0, 4)); err != nil {
		t.Fatal(err)
	}
	if evs := m.del(k); kinds(evs) != "[DOWN ctx/0#3: lease expired]" {
		t.Fatalf("old self expires: %v", evs)
	}
	if evs := m.put(k, enc(t, testRecord("ctx", 0, 4), stateUp), 2); len(evs) != 0 {
		t.Fatalf("own record: %v, want no event", evs)
	}
	if p := m.peers(); len(p) != 0 {
		t.Errorf("peers %v: want self left out", p)
	}
	if evs := m.del(k); kinds(evs) != "[LOST ctx/0#4: lease expired]" {
		t.Fatalf("own key deleted: %v", evs)
	}
	if evs := m.lose(ReasonKeepaliveStopped); len(evs) != 0 {
		t.Fatalf("lost twice: %v", evs)
	}
}

func TestMembersSync(t *testing.T) {
	m := newMembers("c")
	a, b := Key("c", "gen", 0), Key("c", "gen", 1)
	m.put(a, enc(t, testRecord("gen", 0, 1), stateUp), 1)
	m.put(b, enc(t, testRecord("gen", 1, 1), stateUp), 1)
	// While the watch was broken: gen/0 expired, gen/1 restarted, ctx/0
	// joined, and garbage appeared.
	snap := map[string]storedValue{
		b:                  {enc(t, testRecord("gen", 1, 2), stateUp), 2},
		Key("c", "ctx", 0): {enc(t, testRecord("ctx", 0, 1), stateUp), 3},
		Key("c", "ctx", 1): {[]byte("{}"), 3},
	}
	got := kinds(m.sync(snap))
	want := "[DOWN gen/0#1: lease expired UP ctx/0#1 REJECTED /kvxfer/c/ctx/1: key /kvxfer/c/ctx/1: discovery: invalid record: record version 0, want 1 DOWN gen/1#1: superseded by incarnation 2 UP gen/1#2]"
	if got != want {
		t.Errorf("sync:\n got %s\nwant %s", got, want)
	}
	if evs := m.sync(snap); len(evs) != 1 || evs[0].Kind != EventRejected {
		t.Errorf("the same snapshot again: %v, want only the garbage reported", evs)
	}
}
