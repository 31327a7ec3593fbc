package benchutil

import (
	"context"
	"net/http"
	"time"

	"github.com/orbitkv/orbitkv/bench/serving"
)

// ScrapeAll reads every sample of a peer's /metrics at addr (host:port),
// keyed by the series as exposed (name{labels}), with bench serving's
// scraper.
func ScrapeAll(addr string) (map[string]float64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	sample, err := serving.Scrape(ctx, http.DefaultClient, "http://"+addr+"/metrics")
	return sample.Values, err
}
