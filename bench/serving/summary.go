package serving

import (
	"fmt"
	"slices"
)

const maxListed = 20 // mismatches and errors listed in summary.json

// summarize computes summary.json from the rows of the window.
func (r *runner) summarize(rows []Row, w windowResult, drain Drain) Summary {
	slices.SortFunc(rows, func(a, b Row) int { return a.Index - b.Index })
	s := Summary{Workload: r.cfg.Workload, Rows: len(rows), Submitted: w.submitted, Notes: r.notes}
	var ttft, itl, lat []float64
	var prompt, cached, outTok int
	phases := map[string][]float64{}
	for _, row := range rows {
		if row.Reuse {
			s.Reused++
		}
		if row.Error != "" {
			s.Failed++
			if len(s.FirstErrors) < maxListed {
				s.FirstErrors = append(s.FirstErrors, fmt.Sprintf("request %d: %s", row.Index, row.Error))
			}
			continue
		}
		s.Completed++
		if row.MatchReference != nil && !*row.MatchReference {
			s.Mismatches++
			if len(s.MismatchList) < maxListed {
				s.MismatchList = append(s.MismatchList, Mismatch{Index: row.Index, PrefixID: row.PrefixID,
					Phase: row.Phase, Got: row.OutputText, Want: r.refs[row.PrefixID]})
			}
		}
		if row.Phase != "" {
			phases[row.Phase] = append(phases[row.Phase], row.TTFTMS)
		}
		ttft, lat = append(ttft, row.TTFTMS), append(lat, row.LatencyMS)
		itl = append(itl, row.ITLMS...)
		prompt, cached = prompt+row.PromptTokens, cached+row.CachedTokens
		outTok += max(row.CompletionTokens, row.OutputChunks)
	}
	s.TTFTMS, s.ITLMS, s.LatencyMS = Summarize(ttft), Summarize(itl), Summarize(lat)
	if prompt > 0 {
		s.CachedFrac = float64(cached) / float64(prompt)
	}
	if len(phases) > 0 {
		s.Phases = map[string]Stats{}
		for k, v := range phases {
			s.Phases[k] = Summarize(v)
		}
	}
	if !w.admitted.IsZero() {
		s.AdmissionS = w.admitted.Sub(r.start).Seconds()
	}
	if !w.last.IsZero() {
		s.WindowS = w.last.Sub(r.start).Seconds()
	}
	if s.WindowS > 0 {
		s.ThroughputRPS = float64(s.Completed) / s.WindowS
		s.OutputTokPS = float64(outTok) / s.WindowS
		s.PromptTokPS = float64(prompt) / s.WindowS
	}
	if w.restart != nil {
		var ends []float64
		for _, row := range rows {
			if row.Error == "" {
				ends = append(ends, row.StartS+row.LatencyMS/1e3)
			}
		}
		rs := recovery(ends, w.restart.drained.Sub(r.start).Seconds(), w.restart.ready.Sub(r.start).Seconds())
		s.Restart = &rs
	}
	if drain.Checked {
		ok := drain.OK
		s.Drained = &ok
	}
	s.Reasons = append(s.Reasons, r.fails...)
	if s.Failed > 0 {
		s.Reasons = append(s.Reasons, fmt.Sprintf("%d of %d requests failed", s.Failed, len(rows)))
	}
	if s.Completed == 0 {
		s.Reasons = append(s.Reasons, "no request completed")
	}
	if s.Mismatches > 0 && r.cfg.RequireMatch {
		s.Reasons = append(s.Reasons, fmt.Sprintf("%d outputs differ from their reference (--require-match)", s.Mismatches))
	}
	s.Status = "ok"
	if len(s.Reasons) > 0 {
		s.Status = "failed"
	}
	return s
}
