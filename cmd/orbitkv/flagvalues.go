package main

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/orbitkv/orbitkv/bench/serving"
)

// labelFlag collects repeated KEY=VALUE flags.
type labelFlag map[string]string

func (l labelFlag) String() string { return fmt.Sprint(map[string]string(l)) }

func (l labelFlag) Set(s string) error {
	k, v, ok := strings.Cut(s, "=")
	if !ok || k == "" {
		return fmt.Errorf("label %q: want KEY=VALUE", s)
	}
	l[k] = v
	return nil
}

// intsFlag is a comma-separated list of integers.
type intsFlag []int

func (f *intsFlag) String() string {
	s := make([]string, len(*f))
	for i, v := range *f {
		s[i] = strconv.Itoa(v)
	}
	return strings.Join(s, ",")
}

func (f *intsFlag) Set(s string) error {
	var out []int
	for _, p := range strings.Split(s, ",") {
		v, err := strconv.Atoi(strings.TrimSpace(p))
		if err != nil {
			return fmt.Errorf("%q: want comma-separated integers", s)
		}
		out = append(out, v)
	}
	*f = out
	return nil
}

// durationFlag is a serving.Duration flag.
type durationFlag serving.Duration

func (d *durationFlag) String() string { return time.Duration(*d).String() }

func (d *durationFlag) Set(s string) error {
	v, err := time.ParseDuration(s)
	*d = durationFlag(v)
	return err
}
