package sim

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/orbitkv/orbitkv/internal/bytesize"
)

// WriteTable prints r for people.
func (r *Result) WriteTable(w io.Writer) error {
	c := r.Config
	sharing := "off"
	if c.Sharing {
		sharing = "on"
	}
	fmt.Fprintf(w, "orbitkv sim: %d requests, %d hosts, sharing %s, router %s, %s, %d-token pages of %s\n",
		r.Requests, c.Hosts, sharing, c.Router, c.Model.Name, c.PageTokens, bytesize.Size(c.PageBytes()))
	fmt.Fprintf(w, "  per host: HBM prefix cache %d tokens, DRAM %s, SSD %s\n",
		c.HBMTokens, bytesize.Size(c.DRAMBytes), bytesize.Size(c.SSDBytes))
	fmt.Fprintf(w, "  cost: prefill %g µs/token, DRAM→HBM %g GB/s, SSD→HBM %g GB/s, remote %g GB/s\n\n",
		c.Cost.PrefillUsPerToken, c.Cost.DRAMGBps, c.Cost.SSDGBps, c.Cost.NetGBps)

	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	t, h := r.Tokens, r.HitRate
	fmt.Fprintln(tw, "tokens\tinput\thbm\tdram\tssd\tremote\tmiss\t")
	fmt.Fprintf(tw, "count\t%d\t%d\t%d\t%d\t%d\t%d\t\n", t.Input, t.HBM, t.DRAM, t.SSD, t.Remote, t.Miss)
	fmt.Fprintf(tw, "share\t100%%\t%s\t%s\t%s\t%s\t%s\t\n", pct(h.HBM), pct(h.DRAM), pct(h.SSD), pct(h.Remote), pct(h.Miss))
	fmt.Fprintln(tw, "\t\t\t\t\t\t\t")
	b := r.Bytes
	fmt.Fprintln(tw, "GiB moved\tHBM←DRAM\tHBM←SSD\tremote→local\tHBM→DRAM save\tDRAM→SSD demote\t\t")
	fmt.Fprintf(tw, "\t%s\t%s\t%s\t%s\t%s\t\t\n", gib(b.HBMFromDRAM), gib(b.HBMFromSSD), gib(b.RemoteToLocal), gib(b.HBMToDRAM), gib(b.DRAMToSSD))
	fmt.Fprintln(tw, "\t\t\t\t\t\t\t")
	e := r.EvictedPages
	fmt.Fprintln(tw, "pages\tevicted HBM\tevicted DRAM\tevicted SSD\tdemoted\tunsaved\tcolder readmits\t")
	fmt.Fprintf(tw, "\t%d\t%d\t%d\t%d\t%d\t%d\t\n", e.HBM, e.DRAM, e.SSD, r.DemotedPages, r.UnsavedPages, r.ColderReadmits)
	fmt.Fprintln(tw, "\t\t\t\t\t\t\t")
	l := r.TTFTms
	fmt.Fprintln(tw, "TTFT ms\tmean\tp50\tp90\tp99\tmax\t\t")
	fmt.Fprintf(tw, "\t%.1f\t%.1f\t%.1f\t%.1f\t%.1f\t\t\n", l.Mean, l.P50, l.P90, l.P99, l.Max)
	if err := tw.Flush(); err != nil {
		return err
	}
	p := r.Prefill
	fmt.Fprintf(w, "\nprefill compute: %.0f s without a cache, %.0f s computed: %.0f s saved (%s), %.0f s loading, net %.0f s saved\n",
		p.NoCacheS, p.ComputedS, p.SavedS, pct(p.SavedFrac), p.LoadS, p.NetSavedS)
	busy := make([]string, len(r.HostBusy))
	for i, f := range r.HostBusy {
		busy[i] = pct(f)
	}
	_, err := fmt.Fprintf(w, "virtual span %.1f s; host busy %s\n", r.SpanS, strings.Join(busy, " "))
	return err
}

func pct(f float64) string { return fmt.Sprintf("%.1f%%", 100*f) }

func gib(b uint64) string { return fmt.Sprintf("%.1f", float64(b)/(1<<30)) }
