package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// netHost is one "host" of a test cluster: a network namespace with one
// interface (dev) on the cluster's bridge.
type netHost struct {
	ns, addr, dev string
}

// lan is a test network: hosts on one bridge that lives in a namespace of
// its own (no firewall of this machine sees the frames), and a link from
// this namespace to the bridge (proxy, the address of this end) so the test
// can play the P/D proxy and read the peers' metrics, as a router would.
type lan struct {
	hosts  []netHost
	proxy  string
	sw     string
	prefix string // 10.79.N.
}

// threeHosts makes a lan of n hosts, 10.79.N.1..n, removed when the test
// ends. It skips, saying why, where namespaces cannot be made.
func threeHosts(t *testing.T, n int) *lan {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("skipped: network namespaces need root")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("skipped: no ip command (iproute2; scripts/install-deps.sh installs it)")
	}
	pid := os.Getpid()
	l := &lan{sw: fmt.Sprintf("okv-pd-%d-sw", pid), prefix: fmt.Sprintf("10.79.%d.", pid%250)}
	l.proxy = l.prefix + "254"
	ifname := func(s string) string { return fmt.Sprintf("okp%05d%s", pid%100000, s) }
	var made []string
	t.Cleanup(func() {
		for _, ns := range made {
			exec.Command("ip", "netns", "del", ns).Run()
		}
		exec.Command("ip", "link", "del", ifname("p0")).Run() // gone with sw already, unless sw failed
	})
	mustIP(t, "netns", "add", l.sw)
	made = append(made, l.sw)
	mustIP(t, "-n", l.sw, "link", "add", "br0", "type", "bridge")
	mustIP(t, "-n", l.sw, "link", "set", "br0", "up")
	for i := range n {
		h := netHost{ns: fmt.Sprintf("okv-pd-%d-%c", pid, 'a'+i), addr: fmt.Sprintf("%s%d", l.prefix, i+1), dev: "eth0"}
		mustIP(t, "netns", "add", h.ns)
		made = append(made, h.ns)
		host, port := ifname(fmt.Sprintf("h%d", i)), ifname(fmt.Sprintf("s%d", i))
		mustIP(t, "link", "add", host, "type", "veth", "peer", "name", port)
		mustIP(t, "link", "set", host, "netns", h.ns)
		mustIP(t, "-n", h.ns, "link", "set", host, "name", h.dev)
		mustIP(t, "-n", h.ns, "addr", "add", h.addr+"/24", "dev", h.dev)
		mustIP(t, "-n", h.ns, "link", "set", h.dev, "up")
		mustIP(t, "-n", h.ns, "link", "set", "lo", "up")
		mustIP(t, "link", "set", port, "netns", l.sw)
		mustIP(t, "-n", l.sw, "link", "set", port, "master", "br0", "up")
		l.hosts = append(l.hosts, h)
	}
	mustIP(t, "link", "add", ifname("p0"), "type", "veth", "peer", "name", ifname("p1"))
	mustIP(t, "link", "set", ifname("p1"), "netns", l.sw)
	mustIP(t, "-n", l.sw, "link", "set", ifname("p1"), "master", "br0", "up")
	mustIP(t, "addr", "add", l.proxy+"/24", "dev", ifname("p0"))
	mustIP(t, "link", "set", ifname("p0"), "up")
	return l
}

func mustIP(t *testing.T, args ...string) {
	t.Helper()
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
	}
}

// A fault on a host's link: what it is (for the log) and how to heal it.
type fault struct {
	what string
	heal func()
}

// netemWorks reports whether this kernel has the netem qdisc (sch_netem).
func netemWorks(h netHost) bool {
	err := exec.Command("ip", "netns", "exec", h.ns, "tc", "qdisc", "add", "dev", h.dev, "root", "netem", "delay", "1ms").Run()
	if err != nil {
		return false
	}
	exec.Command("ip", "netns", "exec", h.ns, "tc", "qdisc", "del", "dev", h.dev, "root").Run()
	return true
}

// qdisc puts a root qdisc on h's link (egress: what h sends).
func qdisc(t *testing.T, h netHost, what string, spec ...string) fault {
	t.Helper()
	args := append([]string{"netns", "exec", h.ns, "tc", "qdisc", "add", "dev", h.dev, "root"}, spec...)
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		t.Fatalf("tc %s: %v: %s", strings.Join(spec, " "), err, out)
	}
	return fault{what: what + " (tc " + strings.Join(spec, " ") + ")", heal: func() {
		exec.Command("ip", "netns", "exec", h.ns, "tc", "qdisc", "del", "dev", h.dev, "root").Run()
	}}
}

// slowLink delays what h sends: netem's delay where the kernel has netem,
// else a token bucket (tbf) that holds packets behind a low rate (the
// delay grows with the bytes sent: a page fetch waits, a ping barely).
func slowLink(t *testing.T, h netHost, netem bool) fault {
	if netem {
		return qdisc(t, h, "delay", "netem", "delay", "150ms", "20ms")
	}
	return qdisc(t, h, "slow link, no netem in this kernel", "tbf", "rate", "400kbit", "burst", "4kb", "latency", "3s")
}

// lossyLink drops part of what h sends: netem's loss, else a token bucket
// whose short queue drops packets under load (bulk transfers lose segments).
func lossyLink(t *testing.T, h netHost, netem bool) fault {
	if netem {
		return qdisc(t, h, "loss", "netem", "loss", "30%")
	}
	return qdisc(t, h, "lossy link, no netem in this kernel", "tbf", "rate", "1mbit", "burst", "3kb", "limit", "3kb")
}

// linkDown takes h's link down (every packet to and from h is lost).
func linkDown(t *testing.T, h netHost) fault {
	t.Helper()
	mustIP(t, "-n", h.ns, "link", "set", h.dev, "down")
	return fault{what: "link down", heal: func() { mustIP(t, "-n", h.ns, "link", "set", h.dev, "up") }}
}

// partition drops every packet between a and b (blackhole routes on both),
// each still reaching the others and the proxy.
func partition(t *testing.T, a, b netHost) fault {
	t.Helper()
	mustIP(t, "-n", a.ns, "route", "add", "blackhole", b.addr+"/32")
	mustIP(t, "-n", b.ns, "route", "add", "blackhole", a.addr+"/32")
	return fault{what: "partition " + a.addr + " | " + b.addr, heal: func() {
		mustIP(t, "-n", a.ns, "route", "del", "blackhole", b.addr+"/32")
		mustIP(t, "-n", b.ns, "route", "del", "blackhole", a.addr+"/32")
	}}
}
