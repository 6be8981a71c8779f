// Package config resolves the kvxfer CLI's common settings (model, pool,
// tokens per block, workers, backend, timeout, log level, metrics address,
// CURVE identities) from four sources, each overriding the one before it:
//
//  1. the built-in default (a command may supply its own, Loader.Defaults);
//  2. a YAML file (--config FILE or KVXFER_CONFIG), a flat mapping whose
//     keys are the flag names ("workers: 4", "log-level: debug");
//  3. the environment: KVXFER_ and the key in upper case with '-' as '_'
//     (KVXFER_WORKERS, KVXFER_LOG_LEVEL); an empty variable counts as unset;
//  4. command-line flags (--workers), when given.
//
// Every value is checked when it is loaded, whatever the command uses: an
// invalid one fails with an *Error that names the key, where the value came
// from and the value, as in
//
//	KVXFER_WORKERS = "zero": not an integer
//	--pool = "2XB": unknown unit "XB" (want B, KiB, MiB or GiB)
//	kvxfer.yaml:3: timeout = "soon": not a duration such as 30s or 5m
//
// An unknown key in the file is rejected with the key and its line named; an
// unknown KVXFER_ variable only earns a warning (Settings.Warnings), since
// the environment is shared with other tools and versions; the variables
// kvxfer reads elsewhere (OtherEnv: KVXFER_SYSMON, KVXFER_GC_FLOOR, ...)
// earn none.
//
// Keys lists the keys; docs/configuration.md documents them in one table
// (a test keeps the two in step).
//
// It also reads and writes CURVE key files (keyfile.go): kvxfer keygen's
// PREFIX.key and PREFIX.pub say in a header which key they hold, and each
// loader refuses the other kind by name (ReadSecretKey, ReadPublicKey).
//
// The package does no I/O beyond the files it is given and has no global
// state: the environment comes in
// as a lookup function, so tests run in parallel.
package config
