package deploy

import (
	"testing"

	"helm.sh/helm/v3/pkg/lint"
	"helm.sh/helm/v3/pkg/lint/support"
)

// TestChartLints runs `helm lint`'s rules (Chart.yaml, values, templates,
// dependencies) on the chart; a warning fails too, as with --strict.
func TestChartLints(t *testing.T) {
	l := lint.All(chartDir, nil, defaultRelease.Namespace, true)
	for _, m := range l.Messages {
		if m.Severity >= support.InfoSev {
			t.Logf("%s", m)
		}
		if m.Severity >= support.WarningSev {
			t.Errorf("helm lint: %s", m)
		}
	}
}
