package benchutil

import "strings"

// SplitList splits a comma-separated flag value, dropping blanks and the
// spaces around each item.
func SplitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}
