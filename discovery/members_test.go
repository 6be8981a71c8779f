package discovery

import (
	"errors"
	"fmt"
	"strings"
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

// regPut writes r as a registration does: its incarnation key, then the
// record under lease.
func regPut(t *testing.T, m *members, r Record, lease int64) []Event {
	t.Helper()
	evs := m.put(IncarnationKey(m.cluster, r.Instance, r.Rank), registration{Incarnation: r.Incarnation, Lease: lease}.encode(), 0)
	return append(evs, m.put(Key(m.cluster, r.Instance, r.Rank), enc(t, r, stateUp), lease)...)
}

func TestMembersLifecycle(t *testing.T) {
	m := newMembers("c")
	k, ik := Key("c", "gen", 1), IncarnationKey("c", "gen", 1)
	rec := func(inc uint64) Record { return testRecord("gen", 1, inc) }
	steps := []struct {
		name string
		do   func() []Event
		want string
	}{
		{"up 5", func() []Event { return regPut(t, m, rec(5), 1) }, "[UP gen/1#5]"},
		{"same again", func() []Event { return m.put(k, enc(t, rec(5), stateUp), 1) }, "[]"},
		{"older", func() []Event { return m.put(k, enc(t, rec(4), stateUp), 1) }, "[REJECTED"},
		{"newer supersedes", func() []Event { return regPut(t, m, rec(6), 2) },
			"[DOWN gen/1#5: superseded by incarnation 6 UP gen/1#6]"},
		{"expiry", func() []Event { return m.del(k) }, "[DOWN gen/1#6: lease expired]"},
		{"delete again", func() []Event { return m.del(k) }, "[]"},
		{"dead one back, new lease", func() []Event { return m.put(k, enc(t, rec(6), stateUp), 3) }, "[REJECTED"},
		{"dead one back, its lease", func() []Event { return m.put(k, enc(t, rec(6), stateUp), 2) }, "[REJECTED"},
		{"dead one re-registered", func() []Event { return m.put(ik, registration{6, 3}.encode(), 0) }, "[REJECTED"},
		{"up 7", func() []Event { return regPut(t, m, rec(7), 3) }, "[UP gen/1#7]"},
		{"leaves", func() []Event { return m.put(k, enc(t, rec(7), stateLeaving), 3) }, "[DOWN gen/1#7: left]"},
		{"revoked after leaving", func() []Event { return m.del(k) }, "[]"},
		{"leaving seen again", func() []Event { return m.put(k, enc(t, rec(7), stateLeaving), 3) }, "[]"},
		{"registration backwards", func() []Event { return m.put(ik, registration{6, 9}.encode(), 0) }, "[REJECTED"},
		{"incarnation key deleted", func() []Event { return m.del(ik) }, "[]"},
		{"never registered", func() []Event { return m.put(k, enc(t, rec(9), stateUp), 3) }, "[REJECTED"},
		{"up 9", func() []Event { return regPut(t, m, rec(9), 4) }, "[UP gen/1#9]"},
	}
	for _, s := range steps {
		got := kinds(s.do())
		if len(got) < len(s.want) || got[:len(s.want)] != s.want {
			t.Fatalf("%s: %s, want %s", s.name, got, s.want)
		}
	}
	if m.rejected != 6 {
		t.Errorf("rejected %d, want 6", m.rejected)
	}
}

// TestMembersOverwrittenKeyIsDown: a value put at a live rank's key under
// another lease (or none) — a replay of its own record, garbage — is
// refused, and the rank is down: the put took the key off the rank's
// lease, so the lease's end would delete nothing and no Down would come.
// Under the rank's own lease the record is kept (the key still goes with
// the lease). The rank's own registry loses its membership. (Checked to
// fail without the overwrite rule: the rank stayed up for good.)
func TestMembersOverwrittenKeyIsDown(t *testing.T) {
	m := newMembers("c")
	k := Key("c", "gen", 1)
	rec := func(inc uint64) Record { return testRecord("gen", 1, inc) }
	changed := rec(5)
	changed.ControlEndpoint = "tcp://elsewhere:1"
	steps := []struct {
		name string
		do   func() []Event
		want string
	}{
		{"up 5", func() []Event { return regPut(t, m, rec(5), 1) }, "[UP gen/1#5]"},
		{"changed under its own lease", func() []Event { return m.put(k, enc(t, changed, stateUp), 1) }, "[REJECTED"},
		{"replayed without a lease", func() []Event { return m.put(k, enc(t, rec(5), stateUp), 0) },
			"DOWN gen/1#5: " + ReasonOverwritten + "]"},
		{"its lease ends: nothing left", func() []Event { return m.del(k) }, "[]"},
		{"up 6", func() []Event { return regPut(t, m, rec(6), 2) }, "[UP gen/1#6]"},
		{"garbage under another lease", func() []Event { return m.put(k, []byte("{}"), 9) },
			"DOWN gen/1#6: " + ReasonOverwritten + "]"},
		{"5 or 6 never back", func() []Event { return m.put(k, enc(t, rec(6), stateUp), 2) }, "[REJECTED"},
	}
	for _, s := range steps {
		got := kinds(s.do())
		if !strings.HasPrefix(s.want, "[") {
			if !strings.HasSuffix(got, s.want) {
				t.Fatalf("%s: %s, want it to end with %s", s.name, got, s.want)
			}
			continue
		}
		if len(got) < len(s.want) || got[:len(s.want)] != s.want {
			t.Fatalf("%s: %s, want %s", s.name, got, s.want)
		}
		if s.want == "[REJECTED" && strings.Contains(got, "DOWN") {
			t.Fatalf("%s: %s, want the rank kept", s.name, got)
		}
	}
	if p := m.peers(); len(p) != 0 {
		t.Errorf("peers %v after the overwrites", p)
	}
	// The rank's own registry: its membership is lost.
	self := newMembers("c")
	if err := self.register(rec(7)); err != nil {
		t.Fatal(err)
	}
	regPut(t, self, rec(7), 3)
	if err := self.confirm(1); err != nil { // Register completed
		t.Fatal(err)
	}
	if got := kinds(self.put(k, enc(t, rec(7), stateUp), 0)); !strings.HasSuffix(got, "LOST gen/1#7: "+ReasonOverwritten+"]") {
		t.Fatalf("own key overwritten: %s, want LOST", got)
	}
}

func TestMembersRejectsWithoutState(t *testing.T) {
	m := newMembers("c")
	good := enc(t, testRecord("gen", 1, 5), stateUp)
	changed := testRecord("gen", 1, 5)
	changed.ControlEndpoint = "tcp://elsewhere:1"
	ik := IncarnationKey("c", "gen", 1)
	cases := []struct {
		key   string
		value []byte
		lease int64
		want  error
	}{
		{Key("c", "gen", 1), []byte("garbage"), 1, ErrInvalidRecord},
		{Key("c", "gen", 1), good, 0, ErrInvalidRecord},     // no lease
		{Key("c", "gen", 1), good, 1, ErrInvalidRecord},     // never registered
		{Key("c", "gen", 2), good, 1, ErrInvalidRecord},     // another rank's key
		{Key("other", "gen", 1), good, 1, ErrInvalidRecord}, // another cluster
		{"/kvxfer/c/gen", good, 1, ErrInvalidRecord},        // no rank
		{"/kvxfer/c/gen/01", good, 1, ErrInvalidRecord},     // not canonical
		{"/kvxfer/c/gen/1/x", good, 1, ErrInvalidRecord},    // too deep
		{"/kvxfer/c/gen/-1", good, 1, ErrInvalidRecord},     // negative
		{"/kvxfer/c/gen/65536", good, 1, ErrInvalidRecord},  // too large
		{"/kvxfer/c/g\x00n/1", good, 1, ErrInvalidRecord},   // unprintable
		{"/kvxfer/c/gen/incarnation", []byte(`{"v":1,"incarnation":"1","lease":"1"}`), 0, ErrInvalidRecord},
		{ik, []byte("garbage"), 0, ErrInvalidRecord},
		{ik, []byte(`{"v":1,"incarnation":"0","lease":"1"}`), 0, ErrInvalidRecord},
		{ik, []byte(`{"v":1,"incarnation":"1","lease":"0"}`), 0, ErrInvalidRecord},
		{ik, []byte(`{"v":2,"incarnation":"1","lease":"1","x":1}`), 0, ErrInvalidRecord},
		{ik, []byte(`{"v":1,"lease":"1","x":1}`), 0, ErrInvalidRecord},
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
	regPut(t, m, testRecord("gen", 1, 5), 1)
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
	if evs := regPut(t, m, testRecord("ctx", 0, 3), 1); kinds(evs) != "[UP ctx/0#3]" {
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
	if evs := regPut(t, m, testRecord("ctx", 0, 4), 2); len(evs) != 0 {
		t.Fatalf("own record: %v, want no event", evs)
	}
	if err := m.confirm(1); err != nil { // Register completed
		t.Fatal(err)
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
	b := Key("c", "gen", 1)
	regPut(t, m, testRecord("gen", 0, 1), 1)
	regPut(t, m, testRecord("gen", 1, 1), 1)
	// While the watch was broken: gen/0 expired, gen/1 restarted, ctx/0
	// joined, and garbage appeared.
	snap := map[string]storedValue{
		IncarnationKey("c", "gen", 0): {registration{1, 1}.encode(), 0},
		IncarnationKey("c", "gen", 1): {registration{2, 2}.encode(), 0},
		b:                             {enc(t, testRecord("gen", 1, 2), stateUp), 2},
		IncarnationKey("c", "ctx", 0): {registration{1, 3}.encode(), 0},
		Key("c", "ctx", 0):            {enc(t, testRecord("ctx", 0, 1), stateUp), 3},
		Key("c", "ctx", 1):            {[]byte("{}"), 3},
	}
	got := kinds(m.sync(snap, 1))
	want := "[DOWN gen/0#1: lease expired UP ctx/0#1 REJECTED /kvxfer/c/ctx/1: key /kvxfer/c/ctx/1: discovery: invalid record: record has no version (\"v\"), want 1 DOWN gen/1#1: superseded by incarnation 2 UP gen/1#2]"
	if got != want {
		t.Errorf("sync:\n got %s\nwant %s", got, want)
	}
	if evs := m.sync(snap, 1); len(evs) != 1 || evs[0].Kind != EventRejected {
		t.Errorf("the same snapshot again: %v, want only the garbage reported", evs)
	}
}

// FuzzMembersPut: no key, value or lease panics the table; a rejected
// put changes no rank's state.
func FuzzMembersPut(f *testing.F) {
	good, _ := testRecord("gen", 1, 5).Encode()
	f.Add(Key("c", "gen", 1), good, int64(1))
	f.Add(IncarnationKey("c", "gen", 1), registration{5, 1}.encode(), int64(0))
	f.Add("/kvxfer/c/gen/01", []byte("{}"), int64(7))
	f.Fuzz(func(t *testing.T, key string, value []byte, lease int64) {
		m := newMembers("c")
		for _, r := range []Record{testRecord("gen", 1, 5), testRecord("ctx", 0, 2)} {
			regPut(t, m, r, 1)
		}
		before := fmt.Sprint(m.peers())
		regs := map[string]registration{}
		for id, st := range m.ranks {
			regs[id.String()] = st.reg
		}
		evs := m.put(key, value, lease)
		if len(evs) == 1 && evs[0].Kind == EventRejected {
			if got := fmt.Sprint(m.peers()); got != before {
				t.Fatalf("rejected put changed peers: %s -> %s", before, got)
			}
			for id, st := range m.ranks {
				if regs[id.String()] != st.reg {
					t.Fatalf("rejected put changed %s's registration", id)
				}
			}
			if evs[0].Key != key {
				t.Fatalf("rejection names %q, not %q", evs[0].Key, key)
			}
		}
		m.del(key)
	})
}

// TestMembersRegisterNamesIncarnationKey: a registration refused because
// the rank's incarnation key names a higher incarnation names that key
// and the incarnation it holds. It named the record's key, which holds
// nothing then (the value to look at, or delete, is the incarnation
// key's).
func TestMembersRegisterNamesIncarnationKey(t *testing.T) {
	m := newMembers("c")
	ik := IncarnationKey("c", "gen", 0)
	if evs := m.put(ik, registration{Incarnation: 900, Lease: 1}.encode(), 0); len(evs) != 0 {
		t.Fatalf("incarnation key: %v", evs)
	}
	err := m.register(testRecord("gen", 0, 500))
	if !errors.Is(err, ErrStaleIncarnation) {
		t.Fatalf("register below the incarnation key: %v, want %v", err, ErrStaleIncarnation)
	}
	for _, want := range []string{ik, "900", "500", "gen/0"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %s", err, want)
		}
	}
}

// TestMembersNoDownOfSelfAfterLost: once this registry reported its own
// record Lost (its keepalive stopped first), the deletion of that record
// (its lease expiring in etcd) is no Down of this rank — it never had an
// Up, and its Lost was already said — and Peers never lists it.
func TestMembersNoDownOfSelfAfterLost(t *testing.T) {
	m := newMembers("c")
	k := Key("c", "ctx", 0)
	if err := m.register(testRecord("ctx", 0, 4)); err != nil {
		t.Fatal(err)
	}
	if evs := regPut(t, m, testRecord("ctx", 0, 4), 2); len(evs) != 0 {
		t.Fatalf("own record: %v, want no event", evs)
	}
	if err := m.confirm(1); err != nil { // Register completed
		t.Fatal(err)
	}
	if evs := m.lose(ReasonKeepaliveStopped); kinds(evs) != "[LOST ctx/0#4: "+ReasonKeepaliveStopped+"]" {
		t.Fatalf("keepalive stopped: %v", evs)
	}
	if p := m.peers(); len(p) != 0 {
		t.Errorf("peers %v after Lost: want this rank left out", p)
	}
	if evs := m.del(k); len(evs) != 0 {
		t.Errorf("own key deleted after Lost: %v, want no event", evs)
	}
	// A successor of this rank is a peer: Up, then Down.
	if evs := regPut(t, m, testRecord("ctx", 0, 5), 3); kinds(evs) != "[UP ctx/0#5]" {
		t.Errorf("successor: %v, want UP ctx/0#5", evs)
	}
	if evs := m.del(k); kinds(evs) != "[DOWN ctx/0#5: lease expired]" {
		t.Errorf("successor expires: %v", evs)
	}
}

// TestMembersSyncDownsRecordReplacedByRefusedOne: while the watch was
// broken a live rank's lease expired and a new registration of the rank
// was written whose record this registry refuses (a newer build's record
// of a version it does not read, or garbage under the new lease). The
// key no longer holds the live record, so the rank that was up is down.
func TestMembersSyncDownsRecordReplacedByRefusedOne(t *testing.T) {
	m := newMembers("c")
	k, ik := Key("c", "gen", 1), IncarnationKey("c", "gen", 1)
	if evs := regPut(t, m, testRecord("gen", 1, 1), 1); kinds(evs) != "[UP gen/1#1]" {
		t.Fatalf("up: %v", evs)
	}
	newer := strings.Replace(string(enc(t, testRecord("gen", 1, 2), stateUp)), `"v":1,`, `"v":2,"zone":"b",`, 1)
	snap := map[string]storedValue{
		ik: {registration{2, 2}.encode(), 0},
		k:  {[]byte(newer), 2},
	}
	evs := m.sync(snap, 1)
	if !strings.Contains(kinds(evs), "DOWN gen/1#1") {
		t.Errorf("sync: %v, want DOWN gen/1#1 (its key holds another registration's value)", evs)
	}
	if p := m.peers(); len(p) != 0 {
		t.Errorf("peers %v, want gen/1#1 gone", p)
	}
}

// TestMembersNoLostBeforeRegistered: the loss of this registry's own
// record or lease before its Register completed is no Lost (nothing was
// registered to lose); it makes the Register fail (confirm), naming why.
// A later registration of the rank that completes is Lost as usual.
func TestMembersNoLostBeforeRegistered(t *testing.T) {
	k := Key("c", "ctx", 0)
	for _, c := range []struct {
		name string
		lose func(m *members) []Event
		why  string
	}{
		{"keepalive stopped", func(m *members) []Event { return m.lose(ReasonKeepaliveStopped) }, ReasonKeepaliveStopped},
		{"own key deleted", func(m *members) []Event { regPut(t, m, testRecord("ctx", 0, 4), 2); return m.del(k) }, ReasonLeaseExpired},
		{"own key overwritten", func(m *members) []Event {
			regPut(t, m, testRecord("ctx", 0, 4), 2)
			var evs []Event
			for _, e := range m.put(k, []byte("garbage"), 9) {
				if e.Kind != EventRejected { // the garbage's own rejection is expected
					evs = append(evs, e)
				}
			}
			return evs
		}, ReasonOverwritten},
	} {
		m := newMembers("c")
		if err := m.register(testRecord("ctx", 0, 4)); err != nil {
			t.Fatal(err)
		}
		if evs := c.lose(m); len(evs) != 0 {
			t.Errorf("%s before Register completed: %v, want no event", c.name, evs)
		}
		err := m.confirm(1)
		if err == nil || !strings.Contains(err.Error(), "before the registration completed") || !strings.Contains(err.Error(), c.why) {
			t.Errorf("%s: confirm: %v, want an error naming %q", c.name, err, c.why)
		}
		m.unregister(0)
		if evs := m.lose(ReasonKeepaliveStopped); len(evs) != 0 {
			t.Errorf("%s: lose after unregister: %v, want no event", c.name, evs)
		}
		// The next incarnation registers, completes, and is lost: Lost.
		if err := m.register(testRecord("ctx", 0, 5)); err != nil {
			t.Fatal(err)
		}
		regPut(t, m, testRecord("ctx", 0, 5), 3)
		if err := m.confirm(1); err != nil {
			t.Fatalf("%s: confirm of the next incarnation: %v", c.name, err)
		}
		if evs := m.del(k); kinds(evs) != "[LOST ctx/0#5: "+ReasonLeaseExpired+"]" {
			t.Errorf("%s: next incarnation's key deleted: %v, want LOST", c.name, evs)
		}
	}
}

// TestMembersFailedRegisterIsNoPeer: the record of a Register that failed
// after its lease was granted (etcd committed it, its reply was lost) is
// never a peer of its own registry, whether applied before or after the
// failure: no Up, no Down, not in peers. The same incarnation under
// another lease is not its own, and is a peer as any other. (Checked to
// fail without the rule: the table listed its own rank until the record
// expired, with an Up and a Down of it.)
func TestMembersFailedRegisterIsNoPeer(t *testing.T) {
	for _, applied := range []string{"before", "after"} {
		m := newMembers("c")
		k := Key("c", "ctx", 0)
		if err := m.register(testRecord("ctx", 0, 4)); err != nil {
			t.Fatal(err)
		}
		var evs []Event
		if applied == "before" {
			evs = regPut(t, m, testRecord("ctx", 0, 4), 7)
		}
		m.unregister(7) // the Register failed, its lease was 7
		if applied == "after" {
			evs = regPut(t, m, testRecord("ctx", 0, 4), 7)
		}
		if len(evs) != 0 {
			t.Errorf("%s: failed Register's record: %v, want no event", applied, evs)
		}
		if p := m.peers(); len(p) != 0 {
			t.Errorf("%s: peers %v, want none (the failed Register's record is not a peer)", applied, p)
		}
		if evs := m.del(k); len(evs) != 0 {
			t.Errorf("%s: failed Register's record expires: %v, want no event", applied, evs)
		}
	}
	// The incarnation whose Register failed, seen under another lease
	// (another process started with the same incarnation), is a peer.
	m := newMembers("c")
	if err := m.register(testRecord("ctx", 0, 4)); err != nil {
		t.Fatal(err)
	}
	m.unregister(7)
	if evs := regPut(t, m, testRecord("ctx", 0, 4), 8); kinds(evs) != "[UP ctx/0#4]" {
		t.Errorf("incarnation 4 under another lease: %v, want an Up", evs)
	}
	if p := m.peers(); len(p) != 1 {
		t.Errorf("peers %v, want ctx/0#4", p)
	}
}

// TestMembersSyncLosesOwnRecordHiddenByAWatchGap: Register committed this
// rank's record (revision 10) and completed before the watch delivered
// it; the watch then broke, and meanwhile the record was deleted, or
// overwritten with a value no one accepts. The resynchronising read, at or
// after revision 10, is the only sign: it says Lost, once. A read older
// than the registration (taken before its commit, applied after it) says
// nothing, nor does one that holds the record. (Found in a review; checked
// to fail without the check: sync said nothing, and the rank went on
// writing while every peer had put it down.)
func TestMembersSyncLosesOwnRecordHiddenByAWatchGap(t *testing.T) {
	own := testRecord("ctx", 0, 4)
	registered := func(t *testing.T) *members {
		m := newMembers("c")
		if err := m.register(own); err != nil {
			t.Fatal(err)
		}
		if err := m.confirm(10); err != nil {
			t.Fatal(err)
		}
		return m
	}
	inc := storedValue{registration{4, 7}.encode(), 0}
	for _, c := range []struct {
		name string
		snap map[string]storedValue
		rev  int64
		want string
	}{
		{"deleted", map[string]storedValue{IncarnationKey("c", "ctx", 0): inc}, 12, "[LOST ctx/0#4: " + ReasonLeaseExpired + "]"},
		{"overwritten", map[string]storedValue{IncarnationKey("c", "ctx", 0): inc, Key("c", "ctx", 0): {[]byte("garbage"), 9}}, 12,
			"REJECTED"},
		{"read before the registration", map[string]storedValue{}, 9, "[]"},
		{"still there", map[string]storedValue{IncarnationKey("c", "ctx", 0): inc, Key("c", "ctx", 0): {enc(t, own, stateUp), 7}}, 12, "[]"},
	} {
		t.Run(c.name, func(t *testing.T) {
			m := registered(t)
			got := kinds(m.sync(c.snap, c.rev))
			if !strings.Contains(got, c.want) || c.want == "[]" && got != "[]" {
				t.Fatalf("sync: %s, want %s", got, c.want)
			}
			if c.name == "overwritten" && !strings.Contains(got, "LOST ctx/0#4: "+ReasonOverwritten) {
				t.Fatalf("sync: %s, want LOST ctx/0#4: %s", got, ReasonOverwritten)
			}
			if again := kinds(m.sync(c.snap, c.rev)); strings.Contains(again, "LOST") {
				t.Fatalf("the same snapshot again: %s, want no second Lost", again)
			}
		})
	}
}

// TestMembersResyncBeforeRegisterCompletes: Register committed this
// rank's record at revision 10; before it completed (confirm), a
// resynchronising read taken after the commit (revision 12) was applied,
// and it no longer held the record (deleted, or overwritten with a value
// no one accepts, at 11) — the watch gap hid both the put and its end. The
// registration never completed: its Register must fail, naming why. It
// returned nil, and no event ever said the rank was out (the check for
// the record in a read was made only once the Register had completed):
// the rank went on as registered while every peer had it down. A read
// taken before the commit, or one that holds the record, changes nothing.
func TestMembersResyncBeforeRegisterCompletes(t *testing.T) {
	own := testRecord("ctx", 0, 4)
	ik, k := IncarnationKey("c", "ctx", 0), Key("c", "ctx", 0)
	inc := storedValue{registration{4, 7}.encode(), 0}
	for _, c := range []struct {
		name string
		snap map[string]storedValue
		rev  int64
		why  string // "": the Register completes
	}{
		{"deleted", map[string]storedValue{ik: inc}, 12, ReasonLeaseExpired},
		{"overwritten", map[string]storedValue{ik: inc, k: {[]byte("garbage"), 9}}, 12, ReasonOverwritten},
		{"read before the commit", map[string]storedValue{}, 9, ""},
		{"still there", map[string]storedValue{ik: inc, k: {enc(t, own, stateUp), 7}}, 12, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			m := newMembers("c")
			if err := m.register(own); err != nil {
				t.Fatal(err)
			}
			for _, e := range m.sync(c.snap, c.rev) {
				if e.Kind != EventRejected {
					t.Errorf("sync before the Register completed: %v, want no event but the garbage's rejection", e)
				}
			}
			err := m.confirm(10)
			if c.why == "" {
				if err != nil {
					t.Fatalf("confirm: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), "before the registration completed") || !strings.Contains(err.Error(), c.why) {
				t.Fatalf("confirm after a read at %d without the record committed at 10: %v, want an error naming %q", c.rev, err, c.why)
			}
		})
	}
}
