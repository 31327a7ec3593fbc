package transfer

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// benchTransferNetns makes namespaces A and B joined by a veth pair, runs
// the --serve side and iperf3 servers (one per connection of the largest
// cell, on ports port, port+1, …) in A and the --client side in B (this
// binary again, with the same matrix flags), and removes everything at the
// end, also on error or interrupt. With splitCPUs each namespace's
// processes run on their own half of the CPUs, as two hosts would; with rps
// (which needs splitCPUs) each veth's received packets are processed on
// its own namespace's CPUs too (steerReceives).
func benchTransferNetns(ctx context.Context, out io.Writer, args []string, iperfServers, port int, splitCPUs, rps bool) error {
	if os.Geteuid() != 0 {
		return errors.New("bench transfer --netns: network namespaces need root")
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	h, err := newNetnsPair(fmt.Sprintf("okv-bt-%d", os.Getpid()), fmt.Sprintf("10.79.%d", os.Getpid()%250))
	if err != nil {
		return err
	}
	defer h.remove()
	if splitCPUs {
		if h.cpus, err = splitAllowedCPUs(); err != nil {
			return err
		}
	}
	if rps {
		if err := h.steerReceives(); err != nil {
			return err
		}
	}
	matrix := withoutFlag(withoutFlag(withoutFlag(args, "netns"), "split-cpus"), "rps")
	addr := h.addr[0] + ":7949"
	for i := range iperfServers {
		iperfSrv, err := startReady(ctx, h.exec(0, "iperf3", "-s", "-B", h.addr[0], "-p", fmt.Sprint(port+i), "--forceflush"), "Server listening")
		if err != nil {
			return fmt.Errorf("iperf3 server on port %d: %w", port+i, err)
		}
		defer iperfSrv.stop()
	}
	srv, err := startReady(ctx, h.exec(0, self, append([]string{"bench", "transfer", "--serve", addr}, matrix...)...), "serving ")
	if err != nil {
		return fmt.Errorf("serve side: %w", err)
	}
	defer srv.stop()
	// taskset and ip netns exec (without -b) exec the next program in their
	// own process, so the serve side's pid is the child's.
	servePID := srv.cmd.Process.Pid
	fmt.Fprintf(out, "link: veth between network namespaces %s (%s) and %s (%s)\n", h.ns[0], h.addr[0], h.ns[1], h.addr[1])
	if splitCPUs {
		fmt.Fprintf(out, "cpus: %s runs on CPUs %s, %s on CPUs %s (--split-cpus)\n", h.ns[0], h.cpus[0], h.ns[1], h.cpus[1])
	} else {
		fmt.Fprintln(out, "cpus: both namespaces share every CPU (--split-cpus gives each its own half)")
	}
	if rps {
		fmt.Fprintf(out, "rps: each veth's received packets processed on its own namespace's CPUs (rps_cpus %s, %s)\n", h.rps[0], h.rps[1])
	}
	cl := h.exec(1, self, append([]string{"bench", "transfer", "--client", addr, "--iperf3", h.addr[0], "--iperf3-port", fmt.Sprint(port), "--serve-pid", fmt.Sprint(servePID)}, matrix...)...)
	cl.Stdout, cl.Stderr = out, out
	return cl.Run()
}

// netnsPair is two network namespaces joined by a veth pair; cpus, if
// set, are the CPU lists (taskset -c) each namespace's processes run on.
type netnsPair struct {
	ns, addr, link, cpus, rps [2]string
}

func newNetnsPair(prefix, subnet string) (*netnsPair, error) {
	h := &netnsPair{}
	for i := range 2 {
		h.ns[i] = fmt.Sprintf("%s-%c", prefix, 'a'+i)
		h.addr[i] = fmt.Sprintf("%s.%d", subnet, i+1)
		h.link[i] = fmt.Sprintf("okvbt%d%c", os.Getpid()%100000, 'a'+i)
	}
	steps := [][]string{{"netns", "add", h.ns[0]}, {"netns", "add", h.ns[1]},
		{"link", "add", h.link[0], "type", "veth", "peer", "name", h.link[1]}}
	for i := range 2 {
		steps = append(steps, []string{"link", "set", h.link[i], "netns", h.ns[i]},
			[]string{"-n", h.ns[i], "addr", "add", h.addr[i] + "/24", "dev", h.link[i]},
			[]string{"-n", h.ns[i], "link", "set", h.link[i], "up"},
			[]string{"-n", h.ns[i], "link", "set", "lo", "up"})
	}
	for _, s := range steps {
		if b, err := exec.Command("ip", s...).CombinedOutput(); err != nil {
			h.remove()
			return nil, fmt.Errorf("ip %s: %v: %s", strings.Join(s, " "), err, strings.TrimSpace(string(b)))
		}
	}
	return h, nil
}

// remove deletes both namespaces (the veth pair goes with them).
func (h *netnsPair) remove() {
	for _, n := range h.ns {
		exec.Command("ip", "netns", "del", n).Run()
	}
}

func (h *netnsPair) exec(i int, name string, args ...string) *exec.Cmd {
	argv := append([]string{"ip", "netns", "exec", h.ns[i], name}, args...)
	if h.cpus[i] != "" {
		argv = append([]string{"taskset", "-c", h.cpus[i]}, argv...)
	}
	return exec.Command(argv[0], argv[1:]...)
}

// steerReceives sets each veth's receive packet steering (rps_cpus) to its
// namespace's CPUs (h.cpus, set by --split-cpus, which --rps needs), so
// that the packets a namespace receives are processed there, as on two
// hosts; by default a veth's packets are processed on the sending CPU.
// h.rps is what each file reads back (the kernel may drop CPUs it keeps
// for itself).
func (h *netnsPair) steerReceives() error {
	for i := range 2 {
		cpus, err := parseCPUList(h.cpus[i])
		if err != nil {
			return fmt.Errorf("bench transfer --rps: namespace %s: %w", h.ns[i], err)
		}
		mask := cpuMask(cpus)
		path := fmt.Sprintf("/sys/class/net/%s/queues/rx-0/rps_cpus", h.link[i])
		cmd := exec.Command("ip", "netns", "exec", h.ns[i], "sh", "-c", fmt.Sprintf("echo %s > %s && cat %s", mask, path, path))
		b, err := cmd.CombinedOutput()
		if err != nil {
			return fmt.Errorf("bench transfer --rps: %s in %s: %w: %s", path, h.ns[i], err, strings.TrimSpace(string(b)))
		}
		h.rps[i] = strings.TrimSpace(string(b))
	}
	return nil
}

// parseCPUList reads a taskset -c list of single CPUs (0,1,5).
func parseCPUList(list string) ([]int, error) {
	var cpus []int
	for _, f := range strings.Split(list, ",") {
		c, err := strconv.Atoi(f)
		if err != nil || c < 0 || c >= 1024 {
			return nil, fmt.Errorf("cpu list %q: bad CPU %q", list, f)
		}
		cpus = append(cpus, c)
	}
	return cpus, nil
}

// cpuMask is the hex mask sysfs takes for cpus: 32-bit words separated by
// commas, most significant first (00000023 for 0,1,5).
func cpuMask(cpus []int) string {
	var words []uint32
	for _, c := range cpus {
		for len(words) <= c/32 {
			words = append(words, 0)
		}
		words[c/32] |= 1 << (c % 32)
	}
	out := make([]string, len(words))
	for i, w := range words {
		out[len(words)-1-i] = fmt.Sprintf("%08x", w)
	}
	return strings.Join(out, ",")
}

// allowedCPUs returns the CPUs this process may run on.
func allowedCPUs() ([]int, error) {
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		return nil, fmt.Errorf("sched_getaffinity: %w", err)
	}
	var cpus []int
	for c := range 1024 {
		if set.IsSet(c) {
			cpus = append(cpus, c)
		}
	}
	return cpus, nil
}

// splitAllowedCPUs returns the CPUs this process may run on as two lists,
// the first half and the rest, for taskset -c.
func splitAllowedCPUs() ([2]string, error) {
	cpus, err := allowedCPUs()
	if err != nil {
		return [2]string{}, fmt.Errorf("bench transfer --split-cpus: %w", err)
	}
	return halveCPUs(cpus)
}

func halveCPUs(cpus []int) ([2]string, error) {
	if len(cpus) < 2 {
		return [2]string{}, fmt.Errorf("bench transfer --split-cpus: %d CPU allowed, need 2 or more", len(cpus))
	}
	var out [2]string
	for i, c := range cpus {
		half := 0
		if i >= len(cpus)/2 {
			half = 1
		}
		if out[half] != "" {
			out[half] += ","
		}
		out[half] += strconv.Itoa(c)
	}
	return out, nil
}

// child is a process the bench started; exited is closed once it has been
// waited for.
type child struct {
	cmd    *exec.Cmd
	exited chan struct{}
}

// startReady starts cmd and returns once a line of its output contains
// ready, or fails if it exits or 10 s pass first. Its later output is
// discarded.
func startReady(ctx context.Context, cmd *exec.Cmd, ready string) (*child, error) {
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	c := &child{cmd: cmd, exited: make(chan struct{})}
	go func() { cmd.Wait(); pw.Close(); close(c.exited) }()
	found := make(chan bool, 1)
	go func() {
		sc := bufio.NewScanner(pr)
		ok := false
		for sc.Scan() {
			if !ok && strings.Contains(sc.Text(), ready) {
				ok = true
				found <- true
			}
		}
		if !ok {
			found <- false
		}
		// A line too long for the scanner ends the scan early: keep reading,
		// so the child never blocks on a pipe nobody drains.
		io.Copy(io.Discard, pr)
	}()
	timer := time.NewTimer(10 * time.Second)
	defer timer.Stop()
	select {
	case ok := <-found:
		if ok {
			return c, nil
		}
		c.stop() // the scan ended without the ready line; the child may still run
		return nil, fmt.Errorf("%s exited, or wrote a line too long to read, before it was ready", cmd.Args)
	case <-timer.C:
	case <-ctx.Done():
	}
	c.stop()
	return nil, fmt.Errorf("%s not ready (%q) within 10 s", cmd.Args, ready)
}

// stop interrupts the process (by its pid), waits up to 5 s, then kills it.
func (c *child) stop() {
	if c == nil {
		return
	}
	c.cmd.Process.Signal(os.Interrupt)
	select {
	case <-c.exited:
		return
	case <-time.After(5 * time.Second):
	}
	c.cmd.Process.Kill()
	<-c.exited
}

// withoutFlag drops --name (a bool flag) from args.
func withoutFlag(args []string, name string) []string {
	var out []string
	for _, a := range args {
		if a == "-"+name || a == "--"+name || strings.HasPrefix(a, "--"+name+"=") || strings.HasPrefix(a, "-"+name+"=") {
			continue
		}
		out = append(out, a)
	}
	return out
}
