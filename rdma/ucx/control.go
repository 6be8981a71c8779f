package ucx

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// Control messages travel as UCP active messages between two agents' link
// endpoints (one each way). They set up a link, revoke and restore
// registrations, and say goodbye; see doc.go.
type msgKind uint8

const (
	msgHello   msgKind = 1 + iota // "here I am": id, address, live registrations
	msgWelcome                    // the answer to a hello, the same fields
	msgRevoke                     // "stop using registration reg" (answered by msgReply)
	msgRestore                    // "registration reg is live again" (answered by msgReply)
	msgReply                      // ok, or busy: the peer has batches in flight into reg
	msgBye                        // "I am closing: stop writing to me" (answered by msgByeAck)
	msgByeAck                     // "I will not write to you any more"
)

func (k msgKind) String() string {
	switch k {
	case msgHello:
		return "hello"
	case msgWelcome:
		return "welcome"
	case msgRevoke:
		return "revoke"
	case msgRestore:
		return "restore"
	case msgReply:
		return "reply"
	case msgBye:
		return "bye"
	case msgByeAck:
		return "bye-ack"
	}
	return fmt.Sprintf("msgKind(%d)", uint8(k))
}

const (
	msgMagic  = "UCM2"
	msgHeader = len(msgMagic) + 1 + 8 + 16
	// maxLive bounds the registrations a hello lists.
	maxLive = 1 << 16
	// maxIdentity bounds an agent's identity.
	maxIdentity = 256
	// maxMessage bounds a control message as received: far above any
	// (a hello with maxLive registrations is about 512 KiB besides its
	// address), and below what a C int holds.
	maxMessage = 16 << 20
)

var errBadMessage = errors.New("ucx: malformed control message")

// message is one control message's body; on the wire the MAC of the body
// under the link key follows it (linkkey.go: seal, unseal).
//
//	"UCM2" kind u8 req u64 from[16], then for
//	hello, welcome:  len(addr) u32 addr len(ident) u16 ident nextReg u64 n u32 live[n] u64
//	revoke, restore: reg u64
//	reply:           ok u8
//	bye, bye-ack:    nothing
type message struct {
	kind msgKind
	req  uint64 // matches a reply to its request
	from agentID

	addr    []byte // the sender's agent address (encoded)
	ident   []byte // whom the sender serves (WithIdentity); may be empty
	nextReg uint64 // registrations from this id on were made after the hello
	live    []uint64

	reg uint64
	ok  bool
}

func (m *message) encode() []byte {
	b := make([]byte, 0, msgHeader+64+len(m.addr)+8*len(m.live))
	b = append(b, msgMagic...)
	b = append(b, byte(m.kind))
	b = binary.BigEndian.AppendUint64(b, m.req)
	b = append(b, m.from[:]...)
	switch m.kind {
	case msgHello, msgWelcome:
		b = binary.BigEndian.AppendUint32(b, uint32(len(m.addr)))
		b = append(b, m.addr...)
		b = binary.BigEndian.AppendUint16(b, uint16(len(m.ident)))
		b = append(b, m.ident...)
		b = binary.BigEndian.AppendUint64(b, m.nextReg)
		b = binary.BigEndian.AppendUint32(b, uint32(len(m.live)))
		for _, id := range m.live {
			b = binary.BigEndian.AppendUint64(b, id)
		}
	case msgRevoke, msgRestore:
		b = binary.BigEndian.AppendUint64(b, m.reg)
	case msgReply:
		ok := byte(0)
		if m.ok {
			ok = 1
		}
		b = append(b, ok)
	}
	return b
}

// decodeMessage parses a control message; every length is checked, and
// trailing bytes are an error. Errors wrap errBadMessage.
func decodeMessage(b []byte) (*message, error) {
	bad := func(why string) (*message, error) {
		return nil, fmt.Errorf("%w (%d bytes): %s", errBadMessage, len(b), why)
	}
	if len(b) < msgHeader || string(b[:len(msgMagic)]) != msgMagic {
		return bad("no header")
	}
	m := &message{kind: msgKind(b[len(msgMagic)])}
	m.req = binary.BigEndian.Uint64(b[len(msgMagic)+1:])
	copy(m.from[:], b[len(msgMagic)+9:])
	rest := b[msgHeader:]
	switch m.kind {
	case msgHello, msgWelcome:
		if len(rest) < 4 {
			return bad("short hello")
		}
		n := binary.BigEndian.Uint32(rest)
		rest = rest[4:]
		if uint64(n) > uint64(len(rest)) {
			return bad("address past the end")
		}
		m.addr = rest[:n]
		rest = rest[n:]
		if len(rest) < 2 {
			return bad("short identity")
		}
		in := binary.BigEndian.Uint16(rest)
		rest = rest[2:]
		if in > maxIdentity || int(in) > len(rest) {
			return bad(fmt.Sprintf("identity of %d bytes", in))
		}
		m.ident = rest[:in]
		rest = rest[in:]
		if len(rest) < 12 {
			return bad("short registration list")
		}
		m.nextReg = binary.BigEndian.Uint64(rest)
		k := binary.BigEndian.Uint32(rest[8:])
		rest = rest[12:]
		if k > maxLive || uint64(len(rest)) != 8*uint64(k) {
			return bad(fmt.Sprintf("%d live registrations in %d bytes", k, len(rest)))
		}
		m.live = make([]uint64, k)
		for i := range m.live {
			m.live[i] = binary.BigEndian.Uint64(rest[8*i:])
		}
		rest = nil
	case msgRevoke, msgRestore:
		if len(rest) != 8 {
			return bad("registration id")
		}
		m.reg = binary.BigEndian.Uint64(rest)
		rest = nil
	case msgReply:
		if len(rest) != 1 || rest[0] > 1 {
			return bad("reply status")
		}
		m.ok = rest[0] == 1
		rest = nil
	case msgBye, msgByeAck:
	default:
		return bad(fmt.Sprintf("unknown kind %d", m.kind))
	}
	if len(rest) != 0 {
		return bad("trailing bytes")
	}
	return m, nil
}
