package rdma

import (
	"errors"
	"flag"
	"reflect"
	"syscall"
	"testing"
)

func TestParseDevices(t *testing.T) {
	for _, c := range []struct {
		in   string
		want []DeviceSel
		bad  bool
	}{
		{in: "", want: nil},
		{in: "mlx5_0", want: []DeviceSel{{"mlx5_0", 1}}},
		{in: "mlx5_0:2, mlx5_1", want: []DeviceSel{{"mlx5_0", 2}, {"mlx5_1", 1}}},
		{in: "mlx5_0,,", want: []DeviceSel{{"mlx5_0", 1}}},
		{in: "mlx5_0:0", bad: true},
		{in: "mlx5_0:x", bad: true},
		{in: ":1", bad: true},
		{in: "mlx5_0,mlx5_0:1", bad: true},
	} {
		got, err := ParseDevices(c.in)
		if (err != nil) != c.bad || !c.bad && !reflect.DeepEqual(got, c.want) {
			t.Errorf("ParseDevices(%q) = %v, %v; want %v (error %v)", c.in, got, err, c.want, c.bad)
		}
	}
}

func TestConfigFlagsAndValidate(t *testing.T) {
	var cfg Config
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	cfg.RegisterFlags(fs)
	if err := fs.Parse([]string{"--rdma-devices", "mlx5_0,mlx5_1:2", "--rdma-max-mtu", "2048"}); err != nil {
		t.Fatal(err)
	}
	cfg.Defaults()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	if len(cfg.Devices) != 2 || cfg.Devices[1] != (DeviceSel{"mlx5_1", 2}) || cfg.MaxMTU != 2048 {
		t.Fatalf("config %+v", cfg)
	}
	for _, bad := range []func(*Config){
		func(c *Config) { c.MaxMTU = 1500 },
		func(c *Config) { c.SliceBytes = 100 },
		func(c *Config) { c.QPsPerNIC = 65 },
		func(c *Config) { c.MaxSGE = 100 },
	} {
		c := cfg
		bad(&c)
		if c.Validate() == nil {
			t.Errorf("config %+v validated", c)
		}
	}
}

func TestOpenOverTheFake(t *testing.T) {
	for _, c := range []struct {
		name    string
		setup   func(*fakeVerbs)
		allow   []DeviceSel
		wantErr error
		wantNIC []string
	}{
		{name: "every active device", wantNIC: []string{"d0", "d1"}},
		{name: "allowlist", allow: []DeviceSel{{"d1", 1}}, wantNIC: []string{"d1"}},
		{name: "allowlist typo", allow: []DeviceSel{{"d9", 1}}, wantErr: ErrNoDevice},
		{name: "inactive port skipped", setup: func(f *fakeVerbs) { f.devices["d0"].port.State = 1 }, wantNIC: []string{"d1"}},
		{name: "no device active", setup: func(f *fakeVerbs) { f.devices["d0"].port.State = 1; f.devices["d1"].port.State = 1 }, wantErr: ErrNoDevice},
		{name: "kernel without RDMA", setup: func(f *fakeVerbs) { f.fail("deviceList", 0, syscall.ENOSYS) }, wantErr: ErrNoDevice},
		{name: "no devices", setup: func(f *fakeVerbs) { clear(f.devices) }, wantErr: ErrNoDevice},
		{name: "PD fails on one", setup: func(f *fakeVerbs) { f.fail("allocPD", 1, syscall.ENOMEM) }, wantNIC: []string{"d1"}},
	} {
		f := newFakeVerbs("d0", "d1")
		if c.setup != nil {
			c.setup(f)
		}
		e, err := open(f, Config{Devices: c.allow, GIDIndex: -1}, noNetdevs)
		if c.wantErr != nil {
			if !errors.Is(err, c.wantErr) {
				t.Errorf("%s: open = %v, want %v", c.name, err, c.wantErr)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		var names []string
		for _, n := range e.NICs() {
			names = append(names, n.Name)
		}
		if !reflect.DeepEqual(names, c.wantNIC) {
			t.Errorf("%s: NICs %v, want %v", c.name, names, c.wantNIC)
		}
		e.Close()
	}
}

func TestRegisterDeviceThroughDmabuf(t *testing.T) {
	f := newFakeVerbs("d0", "d1")
	e := openFake(t, f, Config{}, "d0", "d1")
	if _, err := e.RegisterDevice("hbm", 1<<40, 1<<21, LocalOnly, nil); !errors.Is(err, ErrNotSupported) {
		t.Fatalf("no exporter: %v, want ErrNotSupported", err)
	}
	exported := 0
	export := func(ptr, size uint64) (int, error) {
		exported++
		r, w, err := pipeFDs()
		if err == nil {
			syscall.Close(w)
		}
		return r, err
	}
	r, err := e.RegisterDevice("hbm", 1<<40, 1<<21, LocalOnly, export)
	if err != nil {
		t.Fatal(err)
	}
	if exported != 1 || len(r.mrs) != 2 || r.Addr != 1<<40 {
		t.Fatalf("exported %d times, %d MRs, addr %#x", exported, len(r.mrs), r.Addr)
	}
	if _, err := e.RegisterDevice("hbm", 1<<40+1, 4096, LocalOnly, export); err == nil {
		t.Fatal("unaligned device range registered")
	}
}

func pipeFDs() (int, int, error) {
	var p [2]int
	err := syscall.Pipe(p[:])
	return p[0], p[1], err
}

// TestDevicesNoneTurnsRDMAOff: --rdma-devices none is off (Open loads
// nothing and says so, as a no-device error the peer falls back on); a
// later allowlist turns it on again; empty is auto-detect.
func TestDevicesNoneTurnsRDMAOff(t *testing.T) {
	for _, tc := range []struct {
		args []string
		off  bool
		devs int
	}{
		{[]string{"--rdma-devices", "none"}, true, 0},
		{[]string{"--rdma-devices", "none", "--rdma-devices", "mlx5_0"}, false, 1},
		{[]string{"--rdma-devices", ""}, false, 0},
		{nil, false, 0},
	} {
		var cfg Config
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		cfg.RegisterFlags(fs)
		if err := fs.Parse(tc.args); err != nil {
			t.Fatal(err)
		}
		if cfg.Off != tc.off || len(cfg.Devices) != tc.devs {
			t.Fatalf("%q: off %v devices %v", tc.args, cfg.Off, cfg.Devices)
		}
	}
	_, err := Open(Config{Off: true, Library: "/nonexistent/libibverbs.so"})
	if !errors.Is(err, ErrDisabled) || !errors.Is(err, ErrNoDevice) {
		t.Fatalf("Open when off: %v, want ErrDisabled (a no-device error)", err)
	}
}
