package ucx

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"hash/crc32"

	"github.com/kvxfer/kvxfer/rdma"
)

// addrMagic starts every ucx agent address; oldAddrMagic started those
// of kvxfer releases before link keys (a random id instead of a public
// key), which this one cannot link with.
const (
	addrMagic    = "UCA2"
	oldAddrMagic = "UCA1"
)

// addrFixed is the size of an address without the UCP worker address.
const addrFixed = len(addrMagic) + 2*pubLen + 4 + 4

// pubLen is the size of an agent's public keys: X25519 (link keys) and
// Ed25519 (its region keys' signatures).
const pubLen = 32

// crcTable is CRC-32C, guarding addresses against corruption in transit.
var crcTable = crc32.MakeTable(crc32.Castagnoli)

// agentID names one agent: the first 128 bits of the SHA-256 of its
// public keys (idOf), so that an address cannot name one agent's id with
// another's keys.
type agentID [16]byte

func (id agentID) String() string { return hex.EncodeToString(id[:4]) }

// idOf is the id of the agent whose X25519 public key is pub and Ed25519
// public key spub.
func idOf(pub, spub [pubLen]byte) agentID {
	h := sha256.New()
	h.Write([]byte("kvxfer ucx agent id\x00"))
	h.Write(pub[:])
	h.Write(spub[:])
	var id agentID
	copy(id[:], h.Sum(nil))
	return id
}

// address is a parsed agent address: the agent's public keys (X25519: two
// agents derive their link key from it, see linkKey; Ed25519: it signs the
// agent's region keys, see key.go), its id (derived from the keys) and its
// UCP worker address (UCX unpacks it in ucp_ep_create; parseAddress
// validates it first, see workeraddr.go).
//
//	"UCA2" pub[32] spub[32] len(worker) u32 worker[len] crc32c(all before) u32
type address struct {
	id     agentID
	pub    [pubLen]byte
	spub   [pubLen]byte
	worker []byte // aliases the parsed bytes
}

// newAddress is the address of the agent with public keys pub and spub.
func newAddress(pub, spub [pubLen]byte, worker []byte) address {
	return address{id: idOf(pub, spub), pub: pub, spub: spub, worker: worker}
}

func (a address) encode() []byte {
	b := make([]byte, 0, addrFixed+len(a.worker))
	b = append(b, addrMagic...)
	b = append(b, a.pub[:]...)
	b = append(b, a.spub[:]...)
	b = binary.BigEndian.AppendUint32(b, uint32(len(a.worker)))
	b = append(b, a.worker...)
	return binary.BigEndian.AppendUint32(b, crc32.Checksum(b, crcTable))
}

// parseAddress parses an encoded address and validates its UCP worker
// address (validateWorkerAddress), so that no peer's bytes reach
// ucp_ep_create unchecked; errors wrap rdma.ErrBadAddress, and
// ErrBadWorkerAddress when the worker address is what is wrong.
func parseAddress(b []byte) (address, error) {
	bad := func(why string) (address, error) {
		return address{}, fmt.Errorf("%w: %d-byte address %.8x…: %s", rdma.ErrBadAddress, len(b), b, why)
	}
	if len(b) >= len(oldAddrMagic) && string(b[:len(oldAddrMagic)]) == oldAddrMagic {
		return bad("the address of an older kvxfer's ucx agent (" + oldAddrMagic + "), which has no link key; this kvxfer speaks " + addrMagic + ": run one version on both sides")
	}
	if len(b) < addrFixed || string(b[:len(addrMagic)]) != addrMagic {
		return bad("not a ucx agent address")
	}
	n := binary.BigEndian.Uint32(b[len(addrMagic)+2*pubLen:])
	if uint64(n) != uint64(len(b)-addrFixed) {
		return bad(fmt.Sprintf("worker address of %d bytes in %d", n, len(b)-addrFixed))
	}
	body := len(b) - 4
	if crc32.Checksum(b[:body], crcTable) != binary.BigEndian.Uint32(b[body:]) {
		return bad("checksum mismatch")
	}
	var a address
	copy(a.pub[:], b[len(addrMagic):])
	copy(a.spub[:], b[len(addrMagic)+pubLen:])
	a.id = idOf(a.pub, a.spub)
	a.worker = b[len(addrMagic)+2*pubLen+4 : body]
	if len(a.worker) == 0 {
		return bad("empty worker address")
	}
	if _, err := validateWorkerAddress(a.worker); err != nil {
		return address{}, fmt.Errorf("%w: agent %s: %w", rdma.ErrBadAddress, a.id, err)
	}
	return a, nil
}
