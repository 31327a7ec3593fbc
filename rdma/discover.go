package rdma

import (
	"net"

	"github.com/Mellanox/rdmamap"
)

// netdevsOf returns the network interfaces whose RDMA device is name (the
// NIC↔netdev map: RoCE GIDs are the addresses of these interfaces, and an
// operator names NICs by either). rdmamap reads sysfs and netlink; a
// machine without /sys/class/infiniband maps nothing.
func netdevsOf(name string) []string {
	ifs, err := net.Interfaces()
	if err != nil {
		return nil
	}
	var out []string
	for _, i := range ifs {
		if i.Flags&net.FlagLoopback != 0 {
			continue
		}
		if dev, err := rdmamap.GetRdmaDeviceForNetdevice(i.Name); err == nil && dev == name {
			out = append(out, i.Name)
		}
	}
	return out
}

// SysfsDevices lists the RDMA devices the kernel knows (/sys/class/infiniband,
// through rdmamap), without loading libibverbs: what `orbitkv bench
// transfer` and the start log print beside the reason RDMA is off.
func SysfsDevices() []string { return rdmamap.GetRdmaDeviceList() }
