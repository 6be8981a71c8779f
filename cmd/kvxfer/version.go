package main

import (
	"encoding/json"
	"fmt"
	"runtime"
	"runtime/debug"

	"github.com/spf13/cobra"
)

// versionInfo is what `kvxfer version` prints.
type versionInfo struct {
	Module    string `json:"module"`
	Version   string `json:"version"`
	GoVersion string `json:"go_version"`
	Platform  string `json:"platform"`
	// Revision, Time and Modified come from the VCS stamp of the build
	// (absent with -buildvcs=false or outside a checkout).
	Revision string `json:"vcs_revision,omitempty"`
	Time     string `json:"vcs_time,omitempty"`
	Modified bool   `json:"vcs_modified,omitempty"`
}

// buildVersion reads the binary's build information.
func buildVersion(read func() (*debug.BuildInfo, bool)) versionInfo {
	v := versionInfo{Module: "github.com/kvxfer/kvxfer", Version: "unknown", GoVersion: runtime.Version(),
		Platform: runtime.GOOS + "/" + runtime.GOARCH}
	bi, ok := read()
	if !ok {
		return v
	}
	if bi.Main.Path != "" {
		v.Module = bi.Main.Path
	}
	if bi.Main.Version != "" {
		v.Version = bi.Main.Version // "(devel)" for a build from a checkout
	}
	if bi.GoVersion != "" {
		v.GoVersion = bi.GoVersion
	}
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			v.Revision = s.Value
		case "vcs.time":
			v.Time = s.Value
		case "vcs.modified":
			v.Modified = s.Value == "true"
		}
	}
	return v
}

func newVersionCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Print kvxfer's module version, Go version and VCS revision",
		Example: examples(
			"", "kvxfer version",
			"for scripts", "kvxfer version --json",
		),
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			v := buildVersion(debug.ReadBuildInfo)
			out := cmd.OutOrStdout()
			if asJSON {
				return json.NewEncoder(out).Encode(v)
			}
			fmt.Fprintf(out, "kvxfer %s (%s)\n%s %s\n", v.Version, v.Module, v.GoVersion, v.Platform)
			switch {
			case v.Revision == "":
				fmt.Fprintln(out, "revision unknown (built without VCS information)")
			case v.Modified:
				fmt.Fprintf(out, "revision %s (%s), with local modifications\n", v.Revision, v.Time)
			default:
				fmt.Fprintf(out, "revision %s (%s)\n", v.Revision, v.Time)
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print one JSON object")
	return cmd
}
