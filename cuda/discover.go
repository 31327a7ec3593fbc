//go:build cgo && linux

// Memory ownership: discovery copies everything it reads into Go values;
// the name and bus-id buffers are Go arrays borrowed for one call each.
// NVML (go-nvml) is initialised once and never shut down, so no handle it
// returned can outlive the library.

package cuda

/*
#include "shim.h"
*/
import "C"

import (
	"fmt"
	"strings"
	"sync"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// nvmlState guards go-nvml: any call after a failed nvml.Init aborts the
// process, so nothing but Init runs until ok is known to be true.
var nvmlState struct {
	once sync.Once
	ok   bool
}

func nvmlReady() bool {
	nvmlState.once.Do(func() {
		defer func() { _ = recover() }() // a missing libnvidia-ml must not crash us
		nvmlState.ok = nvml.Init() == nvml.SUCCESS
	})
	return nvmlState.ok
}

// Devices describes every CUDA device: name, memory and compute shape from
// the driver, PCIe link and free memory from NVML when it is available.
func Devices() ([]DeviceInfo, error) {
	n, err := DeviceCount()
	if err != nil {
		return nil, err
	}
	out := make([]DeviceInfo, 0, n)
	for i := range n {
		info, err := describe(i)
		if err != nil {
			return nil, err
		}
		out = append(out, info)
	}
	return out, nil
}

// Info describes the device (see Devices).
func (d *Device) Info() (DeviceInfo, error) {
	if err := d.live(); err != nil {
		return DeviceInfo{}, err
	}
	return describe(d.ordinal)
}

func describe(ordinal int) (DeviceInfo, error) {
	var dev C.CUdevice
	if r := C.okv_device_get(&dev, C.int(ordinal)); r != 0 {
		return DeviceInfo{}, cudaErr(fmt.Sprintf("cuDeviceGet %d", ordinal), r)
	}
	d := &Device{ordinal: ordinal, dev: dev}
	info := DeviceInfo{
		Ordinal:      ordinal,
		ComputeMajor: d.attr(attrComputeMajor),
		ComputeMinor: d.attr(attrComputeMinor),
		SMs:          d.attr(attrMultiprocessorCount),
		CopyEngines:  d.attr(attrAsyncEngineCount),
		CanMapHost:   d.attr(attrCanMapHostMemory) != 0,
	}
	var name [256]C.char
	if r := C.okv_device_name(&name[0], C.int(len(name)), dev); r != 0 {
		return info, cudaErr("cuDeviceGetName", r)
	}
	info.Name = C.GoString(&name[0])
	var total C.size_t
	if r := C.okv_device_total_mem(&total, dev); r != 0 {
		return info, cudaErr("cuDeviceTotalMem", r)
	}
	info.TotalMemory = uint64(total)
	var bus [64]C.char
	if r := C.okv_device_pci_bus_id(&bus[0], C.int(len(bus)), dev); r != 0 {
		return info, cudaErr("cuDeviceGetPCIBusId", r)
	}
	info.PCIBusID = strings.ToLower(C.GoString(&bus[0]))
	addNVML(&info)
	return info, nil
}

// addNVML fills the PCIe link and free memory of info from NVML, matching
// the device by PCI bus id (CUDA and NVML ordinals can differ).
func addNVML(info *DeviceInfo) {
	if !nvmlReady() {
		return
	}
	h, ret := nvml.DeviceGetHandleByPciBusId(info.PCIBusID)
	if ret != nvml.SUCCESS {
		return
	}
	if v, ret := h.GetCurrPcieLinkGeneration(); ret == nvml.SUCCESS {
		info.PCIeGen = v
	}
	if v, ret := h.GetCurrPcieLinkWidth(); ret == nvml.SUCCESS {
		info.PCIeWidth = v
	}
	if v, ret := h.GetMaxPcieLinkGeneration(); ret == nvml.SUCCESS {
		info.PCIeMaxGen = v
	}
	if v, ret := h.GetMaxPcieLinkWidth(); ret == nvml.SUCCESS {
		info.PCIeMaxWidth = v
	}
	if m, ret := h.GetMemoryInfo(); ret == nvml.SUCCESS {
		info.FreeMemory = m.Free
	}
}
