package ucx

import (
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"hash/crc32"

	"github.com/kvxfer/kvxfer/rdma"
)

// addrMagic starts every ucx agent address.
const addrMagic = "UCA1"

// addrFixed is the size of an address without the UCP worker address.
const addrFixed = len(addrMagic) + 16 + 4 + 4

// crcTable is CRC-32C, guarding addresses against corruption in transit.
var crcTable = crc32.MakeTable(crc32.Castagnoli)

// agentID names one agent (random, 128 bits).
type agentID [16]byte

func (id agentID) String() string { return hex.EncodeToString(id[:4]) }

// address is a parsed agent address: the agent's id and its UCP worker
// address (UCX unpacks it in ucp_ep_create; parseAddress validates it
// first, see workeraddr.go).
//
//	"UCA1" id[16] len(worker) u32 worker[len] crc32c(all before) u32
type address struct {
	id     agentID
	worker []byte // aliases the parsed bytes
}

func (a address) encode() []byte {
	b := make([]byte, 0, addrFixed+len(a.worker))
	b = append(b, addrMagic...)
	b = append(b, a.id[:]...)
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
	if len(b) < addrFixed || string(b[:len(addrMagic)]) != addrMagic {
		return bad("not a ucx agent address")
	}
	n := binary.BigEndian.Uint32(b[len(addrMagic)+16:])
	if uint64(n) != uint64(len(b)-addrFixed) {
		return bad(fmt.Sprintf("worker address of %d bytes in %d", n, len(b)-addrFixed))
	}
	body := len(b) - 4
	if crc32.Checksum(b[:body], crcTable) != binary.BigEndian.Uint32(b[body:]) {
		return bad("checksum mismatch")
	}
	var a address
	copy(a.id[:], b[len(addrMagic):])
	a.worker = b[len(addrMagic)+16+4 : body]
	if len(a.worker) == 0 {
		return bad("empty worker address")
	}
	if _, err := validateWorkerAddress(a.worker); err != nil {
		return address{}, fmt.Errorf("%w: agent %s: %w", rdma.ErrBadAddress, a.id, err)
	}
	return a, nil
}
