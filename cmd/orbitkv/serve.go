package main

import (
	"context"
	"io"
	"os"

	"github.com/rs/zerolog"

	"github.com/orbitkv/orbitkv/fabric"
	"github.com/orbitkv/orbitkv/internal/buildinfo"
)

func version() string { return "orbitkv " + buildinfo.String() }

func runServe(ctx context.Context, args []string, _ io.Writer) error {
	s, err := loadServeSettings("serve", args)
	if err != nil {
		return err
	}
	lvl, err := zerolog.ParseLevel(s.logLevel)
	if err != nil {
		return err
	}
	log := zerolog.New(os.Stderr).Level(lvl).With().Timestamp().Logger()
	if err := s.cfg.Validate(); err != nil {
		return err
	}
	log.Info().Fields(map[string]any{"config": s.fields()}).Str("config_file", s.file).
		Str("version", buildinfo.Version()).Str("revision", buildinfo.Revision()).Str("go", buildinfo.GoVersion()).Msg("starting")
	peer, err := fabric.New(s.cfg, log)
	if err != nil {
		return err
	}
	return peer.Run(ctx)
}
