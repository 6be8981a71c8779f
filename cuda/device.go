package cuda

import (
	"fmt"
	"sync/atomic"
)

// DevicePtr is a device address (CUdeviceptr). The CPU cannot dereference
// it.
type DevicePtr uintptr

// Device is one GPU with its primary context retained. Its methods are safe
// for concurrent use; each driver call makes the primary context current
// on the calling thread inside the same cgo call, so goroutines need not
// lock OS threads.
type Device struct {
	ordinal  int
	dev      int
	ctx      uintptr
	name     string
	busID    string
	totalMem uint64
	closed   atomic.Bool
}

// OpenDevice opens GPU ordinal (0-based, in CUDA's order) and retains its
// primary context. With no usable driver, or no such device, the error
// wraps ErrNoDevice.
func OpenDevice(ordinal int) (*Device, error) {
	n, err := DeviceCount()
	if err != nil {
		return nil, err
	}
	switch {
	case n <= 0:
		return nil, fmt.Errorf("%w: device %d requested, none present: check that a GPU is visible to this process (nvidia-smi; $CUDA_VISIBLE_DEVICES)", ErrNoDevice, ordinal)
	case ordinal < 0 || ordinal >= n:
		return nil, fmt.Errorf("%w: device %d requested, %d present: use an ordinal in 0..%d (CUDA numbers the devices $CUDA_VISIBLE_DEVICES leaves visible from 0)",
			ErrNoDevice, ordinal, n, n-1)
	}
	d := &Device{ordinal: ordinal}
	if d.dev, err = libDeviceGet(ordinal); err != nil {
		return nil, fmt.Errorf("open device %d: %w", ordinal, err)
	}
	if d.name, err = libDeviceName(d.dev); err != nil {
		return nil, fmt.Errorf("open device %d: %w", ordinal, err)
	}
	if d.busID, err = libDevicePCIBusID(d.dev); err != nil {
		return nil, fmt.Errorf("open device %d: %w", ordinal, err)
	}
	if d.totalMem, err = libDeviceTotalMem(d.dev); err != nil {
		return nil, fmt.Errorf("open device %d: %w", ordinal, err)
	}
	if d.ctx, err = libPrimaryCtxRetain(d.dev); err != nil {
		return nil, fmt.Errorf("open device %d: %w", ordinal, err)
	}
	return d, nil
}

// Ordinal is the device's CUDA ordinal.
func (d *Device) Ordinal() int { return d.ordinal }

// Name is the device's product name.
func (d *Device) Name() string { return d.name }

// PCIBusID is the device's PCI bus id (domain:bus:device.function).
func (d *Device) PCIBusID() string { return d.busID }

// TotalMem is the device's memory in bytes.
func (d *Device) TotalMem() uint64 { return d.totalMem }

func (d *Device) String() string {
	return fmt.Sprintf("cuda device %d (%s, %s)", d.ordinal, d.name, d.busID)
}

// context returns the primary context, or ErrClosed after Close.
func (d *Device) context() (uintptr, error) {
	if d.closed.Load() {
		return 0, fmt.Errorf("%s: %w", d, ErrClosed)
	}
	return d.ctx, nil
}

// Close releases the primary context. Everything made from the device
// (memory, streams, events) must be closed first. Idempotent.
func (d *Device) Close() error {
	if d.closed.Swap(true) {
		return nil
	}
	return libPrimaryCtxRelease(d.dev)
}

// CopyHtoD copies src from host memory to dst and returns once it landed.
func (d *Device) CopyHtoD(dst DevicePtr, src []byte) error {
	ctx, err := d.context()
	if err != nil {
		return err
	}
	return libCopyHtoD(ctx, dst, src)
}

// CopyDtoH copies len(dst) bytes from src to host memory and returns once
// they landed.
func (d *Device) CopyDtoH(dst []byte, src DevicePtr) error {
	ctx, err := d.context()
	if err != nil {
		return err
	}
	return libCopyDtoH(ctx, dst, src)
}

// CopyDtoD copies n bytes between device addresses (of this or a peer
// device) and returns once they landed.
func (d *Device) CopyDtoD(dst, src DevicePtr, n uint64) error {
	ctx, err := d.context()
	if err != nil {
		return err
	}
	return libCopyDtoD(ctx, dst, src, n)
}

// PointerDevice returns the ordinal of the device whose memory p is
// (cuPointerGetAttribute, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL): with
// unified addressing the driver resolves another device's pointer too,
// so this is how to tell whose memory an address is.
func (d *Device) PointerDevice(p DevicePtr) (int, error) {
	ctx, err := d.context()
	if err != nil {
		return 0, err
	}
	return libPointerDevice(ctx, p)
}

// AddressRange returns the base and size of the allocation that contains
// p (cuMemGetAddressRange); an address no allocation contains is an error.
func (d *Device) AddressRange(p DevicePtr) (DevicePtr, uint64, error) {
	ctx, err := d.context()
	if err != nil {
		return 0, 0, err
	}
	return libMemAddressRange(ctx, p)
}
