package bytesize

import "testing"

func TestParse(t *testing.T) {
	for in, want := range map[string]Size{"0": 0, "4096": 4096, "256MiB": 256 << 20, "4 GiB": 4 << 30, "1KB": 1000, "3B": 3,
		"1GB": 1000000000, "1GiB": 1 << 30, "4Gi": 4 << 30, "512Mi": 512 << 20, "2TB": 2e12} {
		got, err := Parse(in)
		if err != nil || got != want {
			t.Errorf("Parse(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "GiB", "-1", "1.5GiB", "99999999999TiB", "12XB"} {
		if _, err := Parse(bad); err == nil {
			t.Errorf("Parse(%q): want error", bad)
		}
	}
	if s := Size(256 << 20).String(); s != "256MiB" {
		t.Errorf("String = %s", s)
	}
}

func TestHuman(t *testing.T) {
	for _, c := range []struct {
		n    Size
		want string
	}{{0, "0 B"}, {512, "512 B"}, {9 << 20, "9 MiB"}, {3 << 29, "1.5 GiB"}, {1e9, "953.7 MiB"}, {4 << 40, "4 TiB"}} {
		if got := c.n.Human(); got != c.want {
			t.Errorf("Size(%d).Human() = %q, want %q", uint64(c.n), got, c.want)
		}
	}
}

func FuzzParse(f *testing.F) {
	f.Add("256MiB")
	f.Fuzz(func(t *testing.T, s string) {
		n, err := Parse(s)
		if err != nil {
			return
		}
		if m, err := Parse(n.String()); err != nil || m != n {
			t.Fatalf("%q -> %d -> %q -> %d %v", s, n, n.String(), m, err)
		}
	})
}
