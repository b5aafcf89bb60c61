package pgdedupprom_test

import (
	"encoding/json"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.yaml.in/yaml/v3"

	"github.com/pgdedup/pgdedup"
	"github.com/pgdedup/pgdedup/contrib/pgdedupprom"
	"github.com/pgdedup/pgdedup/pgdeduptest"
)

// The shipped alerting rules (alerts.yml) and dashboard (dashboard.json)
// name only metrics that pgdedup exports. Those are this module's Collector's
// and contrib/pgdedupotel's instruments as the OpenTelemetry Prometheus
// exporter names them. CI also runs `promtool check rules` on alerts.yml,
// which parses the PromQL. This test checks what promtool does not, that every
// rule has a severity and a summary, and names only exported metrics.

// pendingMetrics are metrics the rules use that another change adds to the
// Collector (the partition runway, issue 27). Drop a name once the Collector
// exports it.
var pendingMetrics []string

func TestAlertRulesNameExportedMetrics(t *testing.T) {
	t.Parallel()
	known := exportedMetrics(t)
	var file struct {
		Groups []struct {
			Name  string `yaml:"name"`
			Rules []struct {
				Alert       string            `yaml:"alert"`
				Expr        string            `yaml:"expr"`
				For         string            `yaml:"for"`
				Labels      map[string]string `yaml:"labels"`
				Annotations map[string]string `yaml:"annotations"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	raw, err := os.ReadFile("alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	dec := yaml.NewDecoder(strings.NewReader(string(raw)))
	dec.KnownFields(true)
	if err := dec.Decode(&file); err != nil {
		t.Fatalf("alerts.yml: %v", err)
	}
	if len(file.Groups) == 0 {
		t.Fatal("alerts.yml has no rule group")
	}
	seen := map[string]bool{}
	for _, g := range file.Groups {
		for _, r := range g.Rules {
			switch {
			case r.Alert == "" || seen[r.Alert]:
				t.Errorf("rule %q: a name, once, is required", r.Alert)
			case strings.TrimSpace(r.Expr) == "":
				t.Errorf("%s: no expr", r.Alert)
			case r.Labels["severity"] == "" || r.Annotations["summary"] == "":
				t.Errorf("%s: a severity label and a summary annotation are required", r.Alert)
			}
			seen[r.Alert] = true
			if r.For != "" {
				if _, err := time.ParseDuration(r.For); err != nil {
					t.Errorf("%s: for %q: %v", r.Alert, r.For, err)
				}
			}
			checkExpr(t, r.Alert, r.Expr, known)
		}
	}
	for _, want := range []string{"PgdedupCleanupStarved", "PgdedupPartitionRunwayShort", "PgdedupDeadTuplesHigh", "PgdedupInFlightWaits"} {
		if !seen[want] {
			t.Errorf("alerts.yml has no rule %s", want)
		}
	}
}

func TestDashboardNamesExportedMetrics(t *testing.T) {
	t.Parallel()
	known := exportedMetrics(t)
	var dash struct {
		Title  string `json:"title"`
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	raw, err := os.ReadFile("dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatalf("dashboard.json: %v", err)
	}
	if dash.Title == "" || len(dash.Panels) == 0 {
		t.Fatal("dashboard.json has no title or no panel")
	}
	used := map[string]bool{}
	for _, p := range dash.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, q := range p.Targets {
			for _, m := range checkExpr(t, p.Title, q.Expr, known) {
				used[m] = true
			}
		}
	}
	// Every metric of the Collector has a panel.
	for m, fromCollector := range known {
		if fromCollector && !used[m] {
			t.Errorf("no panel of dashboard.json shows %s", m)
		}
	}
}

// Label lists and matchers, which name labels, not metrics.
var (
	labelLists = regexp.MustCompile(`\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)`)
	matchers   = regexp.MustCompile(`\{[^}]*\}`)
	metricName = regexp.MustCompile(`\b(pgdedup|messaging)_[a-z0-9_]+\b`)
)

// checkExpr reports in t the metrics expr names that are not in known, and
// brackets that do not balance. It returns the metrics it names, histogram
// suffixes removed.
func checkExpr(t *testing.T, where, expr string, known map[string]bool) []string {
	t.Helper()
	for _, pair := range []string{"()", "{}", "[]"} {
		if strings.Count(expr, pair[:1]) != strings.Count(expr, pair[1:]) {
			t.Errorf("%s: unbalanced %s in %q", where, pair, expr)
		}
	}
	var names []string
	for _, m := range metricName.FindAllString(matchers.ReplaceAllString(labelLists.ReplaceAllString(expr, ""), ""), -1) {
		base := m
		for _, suffix := range []string{"_bucket", "_count", "_sum"} {
			if b, ok := strings.CutSuffix(m, suffix); ok && strings.HasSuffix(b, "_seconds") {
				base = b
			}
		}
		if _, ok := known[base]; !ok {
			t.Errorf("%s: %s is not a metric pgdedup exports", where, m)
		}
		names = append(names, base)
	}
	if len(names) == 0 {
		t.Errorf("%s: %q names no pgdedup metric", where, expr)
	}
	return names
}

// exportedMetrics returns the metric names pgdedup exports to Prometheus. It
// maps the Collector's to true. It maps pgdedupotel's to false, read from the
// table in its package doc and named as the OpenTelemetry Prometheus exporter
// names them (dots to underscores, _total for a counter, _seconds for a unit
// s). pendingMetrics map to false too.
func exportedMetrics(t *testing.T) map[string]bool {
	t.Helper()
	store, err := pgdedup.New(pgdeduptest.New(t).Pool, pgdedup.Config{Consumer: "billing"})
	if err != nil {
		t.Fatal(err)
	}
	known := map[string]bool{}
	ch := make(chan *prometheus.Desc, 64)
	pgdedupprom.NewCollector(store, pgdedupprom.Options{}).Describe(ch)
	close(ch)
	fqName := regexp.MustCompile(`fqName: "([^"]+)"`)
	for d := range ch {
		m := fqName.FindStringSubmatch(d.String())
		if m == nil {
			t.Fatalf("no fqName in %s", d)
		}
		known[m[1]] = true
	}
	doc, err := os.ReadFile("../pgdedupotel/doc.go")
	if err != nil {
		t.Fatal(err)
	}
	row := regexp.MustCompile(`(?m)^//\t([a-z.]+)\s+(Int64Counter|Float64Histogram)\s+(\S+)`)
	rows := row.FindAllStringSubmatch(string(doc), -1)
	if len(rows) == 0 {
		t.Fatal("no instrument in pgdedupotel's package doc")
	}
	for _, r := range rows {
		name := strings.ReplaceAll(r[1], ".", "_")
		if r[3] == "s" {
			name += "_seconds"
		}
		if r[2] == "Int64Counter" {
			name += "_total"
		}
		known[name] = false
	}
	for _, m := range pendingMetrics {
		if _, ok := known[m]; !ok {
			known[m] = false
		}
	}
	if !known["pgdedup_rows"] {
		t.Fatalf("the Collector's metrics were not read: %v", known)
	}
	return known
}
