package messages

import (
	"encoding/binary"
	"fmt"
	"math/bits"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/kvxfer/kvxfer/messages/pb"
)

// Decode's first pass. proto.Unmarshal allocates a Go message for every
// element of a repeated message field, however short its encoding: a frame
// of empty elements, two bytes each, makes it allocate 60 to 160 times the
// frame before Validate may count them. So Decode first walks the frame
// with protowire, allocating nothing, and refuses one that is malformed,
// names another version, carries two frame bodies, or holds more elements
// in a repeated field than its bound lets a valid frame hold; only then
// does it unmarshal.

// Field numbers of proto/kvxfer.proto that the walk reads
// (TestDecodeRefusesOverBound checks them against the generated code).
const (
	envVersion protowire.Number = 1
	envHello   protowire.Number = 2
	envRequest protowire.Number = 3
	envLast    protowire.Number = 8 // misaddressed, the last body

	helloPools   protowire.Number = 9
	helloMemory  protowire.Number = 11
	memoryLayers protowire.Number = 3
	memoryBase   protowire.Number = 11

	requestGroups protowire.Number = 8
	requestRemap  protowire.Number = 10
	groupBlocks   protowire.Number = 2
)

// bodyNames names the Envelope's body fields, by number.
var bodyNames = [...]string{2: "hello", 3: "request_data", 4: "result", 5: "cancel", 6: "cancel_ack", 7: "heartbeat", 8: "misaddressed"}

// overBound says that a repeated field holds more elements than its bound.
type overBound struct {
	field string // the field's path, as "request_data.groups"
	what  string // what its elements are, plural
	n     int
	limit int
}

func (e *overBound) Error() string {
	return fmt.Sprintf("%s holds %d %s, want at most %d", e.field, e.n, e.what, e.limit)
}

// checkWire walks b, an encoded Envelope of at most MaxFrameBytes, and
// returns Decode's error for it if b is malformed, carries a version other
// than Version, carries bodies of two frame types, or holds a repeated
// field past its bound; nil if proto.Unmarshal may have it. It allocates
// only on error.
func checkWire(b []byte) error {
	var version uint32
	var body, other protowire.Number
	r := fieldReader{b: b}
	for r.next() {
		switch {
		case r.num == envVersion && r.typ == protowire.VarintType:
			version = uint32(r.x) // as proto.Unmarshal narrows it
		case r.num >= envHello && r.num <= envLast && r.typ == protowire.BytesType:
			// A body of another type would replace this one: Unmarshal
			// allocates a new message at each change.
			if body == 0 {
				body = r.num
			} else if r.num != body && other == 0 {
				other = r.num
			}
		}
	}
	if r.err != nil {
		return malformed(b, r.err)
	}
	if version != Version {
		return &VersionError{Got: version}
	}
	if other != 0 {
		return invalid("frame of %d bytes carries two bodies, %s (envelope field %d) and %s (envelope field %d)",
			len(b), bodyNames[body], body, bodyNames[other], other)
	}
	if body != envHello && body != envRequest {
		return nil // no bounded repeated field
	}
	var c wireCounts
	var err error
	for r = (fieldReader{b: b}); err == nil && r.next(); {
		if r.num != body || r.typ != protowire.BytesType {
			continue
		}
		if body == envHello {
			err = c.hello(r.v)
		} else {
			err = c.requestData(r.v)
		}
	}
	if err == nil {
		err = c.check()
	}
	if over, ok := err.(*overBound); ok {
		return refuse(b, body, over)
	}
	if err != nil {
		return malformed(b, err)
	}
	return nil
}

func malformed(b []byte, err error) error {
	return invalid("malformed frame of %d bytes: %v", len(b), err)
}

// wireCounts counts the bounded repeated fields of a frame's body, summed
// over every occurrence of the body (Unmarshal merges them).
type wireCounts struct {
	pools, memory, groups, remap, blocks int
}

// check bounds the counts of the fields that only Validate bounds
// otherwise. Hello.memory may hold one descriptor per pool, so at most
// MaxGroups; Validate checks it against the pools.
func (c *wireCounts) check() error {
	switch {
	case c.pools > MaxGroups:
		return &overBound{"hello.pools", "pools", c.pools, MaxGroups}
	case c.memory > MaxGroups:
		return &overBound{"hello.memory", "memory descriptors", c.memory, MaxGroups}
	case c.groups > MaxGroups:
		return &overBound{"request_data.groups", "layer groups", c.groups, MaxGroups}
	case c.blocks > MaxBlocks:
		return &overBound{"request_data.groups.blocks", "destination blocks", c.blocks, MaxBlocks}
	case c.remap > MaxRemap:
		return &overBound{"request_data.remap", "remapped extents", c.remap, MaxRemap}
	}
	return nil
}

func (c *wireCounts) hello(b []byte) error {
	r := fieldReader{b: b}
	for r.next() {
		if r.typ != protowire.BytesType {
			continue
		}
		switch r.num {
		case helloPools:
			c.pools++
		case helloMemory:
			c.memory++
			if err := c.kvMemory(r.v); err != nil {
				return err
			}
		}
	}
	return r.err
}

// kvMemory bounds one descriptor: at most MaxMemoryLayers layers and two
// base offsets per layer (Validate wants exactly parts per layer, parts
// 1..2).
func (c *wireCounts) kvMemory(b []byte) error {
	var layers, base int
	r := fieldReader{b: b}
	for r.next() {
		switch r.num {
		case memoryLayers:
			layers += r.elements()
		case memoryBase:
			base += r.elements()
		}
	}
	switch {
	case r.err != nil:
		return r.err
	case layers > MaxMemoryLayers:
		return &overBound{fmt.Sprintf("hello.memory[%d].layers", c.memory-1), "layers", layers, MaxMemoryLayers}
	case base > 2*MaxMemoryLayers:
		return &overBound{fmt.Sprintf("hello.memory[%d].base", c.memory-1), "base offsets", base, 2 * MaxMemoryLayers}
	}
	return nil
}

func (c *wireCounts) requestData(b []byte) error {
	r := fieldReader{b: b}
	for r.next() {
		if r.typ != protowire.BytesType {
			continue
		}
		switch r.num {
		case requestGroups:
			c.groups++
			g := fieldReader{b: r.v}
			for g.next() {
				if g.num == groupBlocks {
					c.blocks += g.elements()
				}
			}
			if g.err != nil {
				return g.err
			}
		case requestRemap:
			c.remap++
		}
	}
	return r.err
}

// fieldReader reads the fields of one encoded message in turn.
type fieldReader struct {
	b   []byte // the fields not yet read
	err error  // why the last field could not be read

	num protowire.Number
	typ protowire.Type
	x   uint64 // a varint field's value
	v   []byte // a length-delimited field's contents
}

// next reads the next field; false at the end of the message or at a
// malformed field (err).
func (r *fieldReader) next() bool {
	if len(r.b) == 0 {
		return false
	}
	var num protowire.Number
	var typ protowire.Type
	n := 1
	if t := r.b[0]; t >= 1<<3 && t < 0x80 { // a one-byte tag: fields 1..15
		num, typ = protowire.Number(t>>3), protowire.Type(t&7)
	} else if num, typ, n = protowire.ConsumeTag(r.b); n < 0 {
		r.err, r.b = protowire.ParseError(n), nil
		return false
	}
	var m int
	switch typ {
	case protowire.VarintType:
		r.x, m = protowire.ConsumeVarint(r.b[n:])
	case protowire.BytesType:
		if rest := r.b[n:]; len(rest) > 0 && rest[0] < 0x80 && int(rest[0]) < len(rest) { // a one-byte length
			r.v, m = rest[1:1+rest[0]], 1+int(rest[0])
			break
		}
		r.v, m = protowire.ConsumeBytes(r.b[n:])
	default:
		m = protowire.ConsumeFieldValue(num, typ, r.b[n:])
	}
	if m < 0 {
		r.err, r.b = protowire.ParseError(m), nil
		return false
	}
	r.num, r.typ, r.b = num, typ, r.b[n+m:]
	return true
}

// elements is how many elements the field appends to a repeated varint
// field: one unpacked, one per varint packed (as Unmarshal counts them, by
// their last bytes), none in another wire type (an unknown field).
func (r *fieldReader) elements() int {
	switch r.typ {
	case protowire.VarintType:
		return 1
	case protowire.BytesType:
		n, v := 0, r.v
		for ; len(v) >= 8; v = v[8:] {
			n += bits.OnesCount64(^binary.LittleEndian.Uint64(v) & 0x8080808080808080)
		}
		for _, x := range v {
			if x < 0x80 {
				n++
			}
		}
		return n
	}
	return 0
}

// refuse is checkWire's error for a frame holding a field past its bound.
// The frame is decoded without its bounded fields, for the sender and
// request it names where they are valid: such a RequestData comes back as
// an InvalidFrame, as one that failed Validate does.
func refuse(b []byte, body protowire.Number, over *overBound) error {
	switch m := withoutBounded(b, body).(type) {
	case *Hello:
		if m.From.validate() == nil {
			return invalid("hello from %s: %v", m.From, over)
		}
	case *RequestData:
		if m.Named() == nil {
			return &InvalidFrame{Frame: m, Err: invalid("request %s from %s: %v", m.RequestID, m.From, over)}
		}
	}
	return invalid("%v", over)
}

// withoutBounded decodes b, an Envelope whose body is field body, leaving
// out the body's bounded repeated fields; nil if that fails. Only b's
// top-level fields are known to be well formed (checkWire's first pass):
// its walk of a body stops at the field past its bound, so what follows
// in that body, and any later body, may be malformed, and is checked here.
func withoutBounded(b []byte, body protowire.Number) Frame {
	drop := [2]protowire.Number{helloPools, helloMemory}
	if body == envRequest {
		drop = [2]protowire.Number{requestGroups, requestRemap}
	}
	var out []byte
	for rest := b; len(rest) > 0; {
		num, typ, n := protowire.ConsumeField(rest)
		if n < 0 {
			return nil
		}
		if num != body || typ != protowire.BytesType {
			out = append(out, rest[:n]...)
			rest = rest[n:]
			continue
		}
		_, _, m := protowire.ConsumeTag(rest)
		v, _ := protowire.ConsumeBytes(rest[m:])
		var kept []byte
		for len(v) > 0 {
			num, _, k := protowire.ConsumeField(v)
			if k < 0 {
				return nil
			}
			if num != drop[0] && num != drop[1] {
				kept = append(kept, v[:k]...)
			}
			v = v[k:]
		}
		out = protowire.AppendBytes(protowire.AppendTag(out, num, typ), kept)
		rest = rest[n:]
	}
	var env pb.Envelope
	if proto.Unmarshal(out, &env) != nil {
		return nil
	}
	f, err := fromWire(&env)
	if err != nil {
		return nil
	}
	incarnationsFromWire(&env, f)
	return f
}
