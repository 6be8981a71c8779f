package cuda

import (
	"encoding/hex"
	"fmt"
)

// IPCHandle names a device allocation across processes
// (CUipcMemHandle): another process of the same node opens it to map the
// allocation into its own address space.
type IPCHandle [64]byte

func (h IPCHandle) String() string { return hex.EncodeToString(h[:8]) + "…" }

// IPCHandle returns the handle of the allocation whose base address is p
// (cuIpcGetMemHandle). p must be the base of a cuMemAlloc allocation: use
// AddressRange to find it for an address inside one.
func (d *Device) IPCHandle(p DevicePtr) (IPCHandle, error) {
	ctx, err := d.context()
	if err != nil {
		return IPCHandle{}, err
	}
	h, err := libIPCGet(ctx, p)
	if err != nil {
		return IPCHandle{}, fmt.Errorf("%s: IPC handle of %#x: %w", d, uintptr(p), err)
	}
	return h, nil
}

// OpenIPC maps the allocation h names, exported by another process, into
// this process on the device (with peer access enabled lazily) and returns
// its base address here. A process cannot open its own handles (the driver
// refuses): use the address directly. Close the mapping with CloseIPC.
func (d *Device) OpenIPC(h IPCHandle) (DevicePtr, error) {
	ctx, err := d.context()
	if err != nil {
		return 0, err
	}
	p, err := libIPCOpen(ctx, h, ipcLazyEnablePeerAccess)
	if err != nil {
		return 0, fmt.Errorf("%s: open IPC handle %s: %w", d, h, err)
	}
	return p, nil
}

// CloseIPC unmaps an allocation OpenIPC mapped. Nothing may still use it
// (synchronise the streams that did first).
func (d *Device) CloseIPC(p DevicePtr) error {
	ctx, err := d.context()
	if err != nil {
		return err
	}
	return libIPCClose(ctx, p)
}
