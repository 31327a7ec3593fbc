package rdma

import (
	"flag"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Config configures an Engine. The zero value plus Defaults is usable.
type Config struct {
	// Devices is the NIC allowlist (--rdma-devices): empty means every
	// device with an active port. Each entry is a device name with an
	// optional port, "mlx5_0" or "mlx5_0:1" (port 1 is the default).
	Devices []DeviceSel
	// Off turns RDMA off (--rdma-devices none): Open returns ErrDisabled.
	Off bool
	// Library is the libibverbs to dlopen ("" = libibverbs.so.1;
	// ORBITKV_LIBIBVERBS overrides it).
	Library string
	// GIDIndex is the GID table index used for addressing, whatever its
	// type (a RoCE v1 one only this way); -1 chooses by type and scope: on
	// Ethernet a RoCE v2 GID, IPv4-mapped first, then global, then
	// link-local; on InfiniBand the first non-zero GID (chooseGID).
	GIDIndex int
	// MaxMTU caps the path MTU in bytes (256…4096); the lane uses
	// min(local active MTU, peer's, MaxMTU).
	MaxMTU int
	// QPsPerNIC is the number of lanes (RC QPs) per local NIC in a Conn.
	QPsPerNIC int
	// SliceBytes is the largest single work request, in bytes: a longer
	// operation is cut into slices striped over the lanes.
	SliceBytes uint64
	// SendDepth is the send queue depth per QP (work requests in flight).
	SendDepth int
	// MaxSGE is the scatter/gather entries per work request.
	MaxSGE int
	// Timeout bounds a batch whose context has no deadline.
	Timeout time.Duration
	// DrainTimeout bounds the wait for flushed completions after a QP was
	// moved to the error state (a failed or timed-out batch).
	DrainTimeout time.Duration
	// MaxReconnects is how many times in a row one lane is reconnected
	// after errors before it is left down (no reconnect storms); 0 means
	// the default (3), negative means never.
	MaxReconnects int
	// Retries is how many times a failed slice is retried on another lane;
	// 0 means the default (1), negative means never.
	Retries int
}

// DeviceSel names one allowed NIC port.
type DeviceSel struct {
	Name string
	Port uint8
}

func (d DeviceSel) String() string { return fmt.Sprintf("%s:%d", d.Name, d.Port) }

// Defaults fills zero fields with their defaults.
func (c *Config) Defaults() {
	def := func(p *int, v int) {
		if *p == 0 {
			*p = v
		}
	}
	def(&c.MaxMTU, 4096)
	def(&c.QPsPerNIC, 1)
	def(&c.SendDepth, 128)
	def(&c.MaxSGE, 16)
	def(&c.MaxReconnects, 3)
	def(&c.Retries, 1)
	if c.SliceBytes == 0 {
		c.SliceBytes = 1 << 20
	}
	if c.Timeout == 0 {
		c.Timeout = 10 * time.Second
	}
	if c.DrainTimeout == 0 {
		c.DrainTimeout = time.Second
	}
}

// Validate reports the first field out of range.
func (c Config) Validate() error {
	switch {
	case mtuFromBytes(c.MaxMTU) == 0:
		return fmt.Errorf("rdma: max MTU %d: want 256, 512, 1024, 2048 or 4096", c.MaxMTU)
	case c.QPsPerNIC < 1 || c.QPsPerNIC*max(1, len(c.Devices)) > maxLanes:
		return fmt.Errorf("rdma: %d QPs per NIC: want 1…%d lanes in all", c.QPsPerNIC, maxLanes)
	case c.SliceBytes < 4096 || c.SliceBytes > 1<<30:
		return fmt.Errorf("rdma: slice of %d bytes: want 4 KiB…1 GiB", c.SliceBytes)
	case c.SendDepth < 1 || c.SendDepth > 16384:
		return fmt.Errorf("rdma: send depth %d: want 1…16384", c.SendDepth)
	case c.MaxSGE < 1 || c.MaxSGE > 64:
		return fmt.Errorf("rdma: %d SGEs per request: want 1…64", c.MaxSGE)
	case c.GIDIndex < -1 || c.GIDIndex > 255:
		return fmt.Errorf("rdma: GID index %d: want -1…255", c.GIDIndex)
	case c.Timeout <= 0 || c.DrainTimeout <= 0:
		return fmt.Errorf("rdma: timeouts must be positive (timeout %v, drain %v)", c.Timeout, c.DrainTimeout)
	}
	return nil
}

// ParseDevices parses an allowlist: comma-separated "name" or "name:port".
// An empty string allows every device.
func ParseDevices(s string) ([]DeviceSel, error) {
	var out []DeviceSel
	seen := map[DeviceSel]bool{}
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		name, port, hasPort := strings.Cut(f, ":")
		d := DeviceSel{Name: name, Port: 1}
		if hasPort {
			p, err := strconv.ParseUint(port, 10, 8)
			if err != nil || p == 0 {
				return nil, fmt.Errorf("rdma devices %q: port %q: want 1…255", s, port)
			}
			d.Port = uint8(p)
		}
		if name == "" || strings.ContainsAny(name, " /") {
			return nil, fmt.Errorf("rdma devices %q: bad device name %q", s, name)
		}
		if seen[d] {
			return nil, fmt.Errorf("rdma devices %q: %s listed twice", s, d)
		}
		seen[d] = true
		out = append(out, d)
	}
	return out, nil
}

// devicesFlag makes the allowlist a flag.Value.
type devicesFlag struct{ c *Config }

func (f devicesFlag) String() string {
	if f.c == nil {
		return ""
	}
	if f.c.Off {
		return "none"
	}
	s := make([]string, len(f.c.Devices))
	for i, d := range f.c.Devices {
		s[i] = d.String()
	}
	return strings.Join(s, ",")
}

func (f devicesFlag) Set(s string) error {
	if strings.TrimSpace(s) == "none" {
		f.c.Devices, f.c.Off = nil, true
		return nil
	}
	d, err := ParseDevices(s)
	if err == nil {
		f.c.Devices, f.c.Off = d, false
	}
	return err
}

// RegisterFlags adds the engine's flags to fs (--rdma-devices, …).
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	fs.Var(devicesFlag{c}, "rdma-devices", "RDMA NIC allowlist, comma-separated name[:port] (empty: every device with an active port; none: RDMA off, TCP only)")
	fs.IntVar(&c.GIDIndex, "rdma-gid-index", c.GIDIndex, "GID table index, any type (-1: a RoCE v2 GID, IPv4-mapped first, then global, then link-local; never RoCE v1)")
	fs.IntVar(&c.MaxMTU, "rdma-max-mtu", c.MaxMTU, "largest RDMA path MTU in bytes (256…4096)")
	fs.IntVar(&c.QPsPerNIC, "rdma-qps-per-nic", c.QPsPerNIC, "RC queue pairs per NIC in each connection")
}
