package cudaipc

import (
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"os"

	"github.com/kvxfer/kvxfer/cuda"
	"github.com/kvxfer/kvxfer/internal/pidwatch"
	"github.com/kvxfer/kvxfer/rdma"
)

// ForgedEntry is one allocation of a forged key's table.
type ForgedEntry struct {
	Handle        cuda.IPCHandle
	AllocOff, Off uint64
	Len           uint64
}

// ForgeKey plays a hostile receiver: it reads the table of key's control
// file, lets edit change it, and publishes the result as a new
// registration of the same owner (a control file of the owner's pid, the
// key's owner and secret, a live lease) — with the table's digest, or
// with the old one when staleDigest. It returns the forged key and a
// function that removes its control file.
func ForgeKey(key []byte, edit func([]ForgedEntry) []ForgedEntry, staleDigest bool) ([]byte, func() error, error) {
	k, err := parseKey(key)
	if err != nil {
		return nil, nil, err
	}
	ctl, es, err := openControl(k)
	if err != nil {
		return nil, nil, err
	}
	ctl.close()
	fes := make([]ForgedEntry, len(es))
	for i, e := range es {
		fes[i] = ForgedEntry{Handle: e.handle, AllocOff: e.allocOff, Off: e.off, Len: e.len}
	}
	if edit != nil {
		fes = edit(fes)
	}
	es = es[:0]
	for _, f := range fes {
		es = append(es, entry{handle: f.Handle, allocOff: f.AllocOff, off: f.Off, len: f.Len})
	}
	table := encodeTable(es)
	k.count = len(es)
	if !staleDigest {
		k.digest = sha256.Sum256(table)
	}
	rand.Read(k.fileID[:])
	path := controlPath(k.pid, k.fileID)
	m, err := createControl(path, len(es), table)
	if err != nil {
		return nil, nil, err
	}
	c := m.c
	copy(c.magic[:], controlMagic)
	c.fileID, c.length, c.count, c.digest = k.fileID, k.length, uint64(k.count), k.digest
	c.setOwner(k.owner)
	c.setSecret(k.secret)
	c.lease.Reset(false)
	return k.encode(), func() error { return errors.Join(os.Remove(path), m.close()) }, nil
}

// ForgeCount returns key claiming count allocations.
func ForgeCount(key []byte, count int) []byte {
	k, err := parseKey(key)
	if err != nil {
		panic(err)
	}
	k.count = count
	return k.encode()
}

// ForgeSecret returns key with another secret: the same owner, control
// file and table.
func ForgeSecret(key []byte) []byte {
	k, err := parseKey(key)
	if err != nil {
		panic(err)
	}
	k.secret[0] ^= 0xff
	return k.encode()
}

// ForgeOwner republishes key's registration unchanged (ForgeKey) under a
// control file that names another owner than the key (and the endpoint's
// peer) does. It returns the forged key and a function that removes its
// control file.
func ForgeOwner(key []byte) ([]byte, func() error, error) {
	fk, remove, err := ForgeKey(key, nil, false)
	if err != nil {
		return nil, nil, err
	}
	k, err := parseKey(fk)
	if err != nil {
		return nil, nil, errors.Join(err, remove())
	}
	ctl, _, err := openControl(k)
	if err != nil {
		return nil, nil, errors.Join(err, remove())
	}
	other := k.owner
	other[0] ^= 0xff
	ctl.c.setOwner(other)
	return fk, remove, ctl.close()
}

// PeerTargets is the number of peer registrations ep keeps mapped: the
// slots of MaxPeerRegistrations it holds.
func PeerTargets(ep rdma.Endpoint) int {
	e := ep.(*endpoint)
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.targets)
}

// ImportRefs counts this process's references to mappings of other
// processes' allocations.
func ImportRefs() int {
	imports.mu.Lock()
	defer imports.mu.Unlock()
	n := 0
	for _, im := range imports.m {
		n += im.refs
	}
	return n
}

// AgentFile is what an agent file states (see agentFile).
type AgentFile struct {
	Pid      int
	Nonce    [16]byte
	Start    uint64
	Host     string
	Identity string
}

// WriteAgentFile writes, mode 0600, the agent file named for the agent
// "cudaipc2:<pid>:<nonce>" (a fresh nonce), stating what edit makes of the
// truth about process pid (its start time, this host) and identity; edit
// nil writes no file. It returns the address and the file's path.
func WriteAgentFile(pid int, identity string, edit func(*AgentFile)) (addr []byte, path string, err error) {
	a := address{pid: pid}
	rand.Read(a.nonce[:])
	path = agentPath(a)
	if edit == nil {
		return []byte(a.String()), path, nil
	}
	start, err := pidwatch.StartTime(pid)
	if err != nil {
		return nil, "", err
	}
	host, err := thisHost()
	if err != nil {
		return nil, "", err
	}
	f := AgentFile{Pid: pid, Nonce: a.nonce, Start: start, Host: host, Identity: identity}
	edit(&f)
	b := agentFile{addr: address{pid: f.Pid, nonce: f.Nonce}, start: f.Start, host: f.Host, identity: f.Identity}.encode()
	return []byte(a.String()), path, os.WriteFile(path, b, 0o600)
}

// AgentPath names the agent file of the agent at addr.
func AgentPath(addr []byte) string {
	a, err := parseAddress(addr)
	if err != nil {
		panic(err)
	}
	return agentPath(a)
}

// SetPidfdOpen makes openProcess call f for pidfd_open until restore.
func SetPidfdOpen(f func(pid, flags int) (int, error)) (restore func()) {
	old := pidfdOpen
	pidfdOpen = f
	return func() { pidfdOpen = old }
}

// OpenProcess is openProcess.
func OpenProcess(pid int) (*os.File, error) { return openProcess(pid) }
