package config

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// ErrKeyFile is wrapped by every error reading or writing a CURVE key
// file (and so is ErrInvalid: a wrong key file is a configuration error).
var ErrKeyFile = fmt.Errorf("%w: key file", ErrInvalid)

// KeyKind is what a CURVE key file holds.
type KeyKind uint8

const (
	// KeyBare: one bare Z85 key, as kvxfer keygen wrote before key files
	// had a header; whether it is public or secret cannot be told.
	KeyBare KeyKind = iota
	// KeyPublic: a public key only (PREFIX.pub): give it to peers.
	KeyPublic
	// KeySecret: a secret key (and its public key) (PREFIX.key): keep it.
	KeySecret
)

func (k KeyKind) String() string {
	switch k {
	case KeyBare:
		return "a bare key (legacy format, public or secret cannot be told)"
	case KeyPublic:
		return "a CURVE public key"
	case KeySecret:
		return "a CURVE secret key"
	}
	return fmt.Sprintf("KeyKind(%d)", uint8(k))
}

// KeyFile is a CURVE key file as read.
type KeyFile struct {
	Path string
	Kind KeyKind
	// Public is the public key (KeyPublic; KeySecret when the file gives it).
	Public string
	// Secret is the secret key (KeySecret), or the bare key (KeyBare).
	Secret string
}

// Key files are in ZeroMQ's certificate format (zcert, ZPL): a comment
// header saying what the file is, then a curve section with public-key
// and, in a secret file only, secret-key. CZMQ's certificates read as
// well. A file of one bare Z85 key (the format before) reads as KeyBare.
const (
	publicHeader = `#   kvxfer CURVE public key (ZeroMQ certificate format), written by kvxfer keygen.
#   Give it to the peer engine, whose --peer-key it is. It is not a secret.
`
	secretHeader = `#   kvxfer CURVE **secret** key (ZeroMQ certificate format), written by kvxfer keygen.
#   This engine's --key: keep it private, mode 0600. Peers get the .pub file.
`
)

// FormatPublicKeyFile is the text of a public key file for key (Z85).
func FormatPublicKeyFile(public string) []byte {
	return []byte(publicHeader + "\nmetadata\ncurve\n    public-key = \"" + public + "\"\n")
}

// FormatSecretKeyFile is the text of a secret key file: the secret key and
// its public key (Z85).
func FormatSecretKeyFile(public, secret string) []byte {
	return []byte(secretHeader + "\nmetadata\ncurve\n    public-key = \"" + public + "\"\n    secret-key = \"" + secret + "\"\n")
}

// ReadKeyFile reads a CURVE key file and says what it holds.
func ReadKeyFile(path string) (KeyFile, error) {
	b, err := os.ReadFile(filepath.Clean(path))
	if err != nil {
		return KeyFile{}, fmt.Errorf("%w: %w", ErrKeyFile, err)
	}
	kf, why := parseKeyFile(b)
	if why != "" {
		return KeyFile{}, fmt.Errorf("%w %s: %s", ErrKeyFile, path, why)
	}
	kf.Path = path
	return kf, nil
}

// ReadSecretKey reads this engine's secret key (--key). A public key file
// is refused, naming the file and what it holds; so is a bare key in a
// file named *.pub (the legacy format cannot tell, the name can).
func ReadSecretKey(path string) (string, error) {
	kf, err := ReadKeyFile(path)
	if err != nil {
		return "", err
	}
	switch {
	case kf.Kind == KeyPublic:
		return "", fmt.Errorf("%w %s holds a CURVE public key, not a secret key: --key wants this engine's secret key file (kvxfer keygen writes PREFIX.key beside PREFIX.pub)", ErrKeyFile, path)
	case kf.Kind == KeyBare && strings.HasSuffix(path, ".pub"):
		return "", fmt.Errorf("%w %s is named as a public key file: --key wants this engine's secret key file (PREFIX.key); the file holds one bare key, the format before key files said which they hold, so rewrite the pair with kvxfer keygen if the name is wrong", ErrKeyFile, path)
	}
	return kf.Secret, nil
}

// SecretKeyExposed says what a warning should say when the secret key
// file at path can be read by others than its owner (a group or other
// read bit, as kvxfer keygen never writes it: 0600), and "" when it
// cannot, or when path cannot be examined (reading it reports that). A
// warning, not a refusal: a mounted secret (a Kubernetes secret volume's
// default mode is 0644) may be private to its container all the same.
func SecretKeyExposed(path string) string {
	fi, err := os.Stat(filepath.Clean(path))
	if err != nil || fi.Mode().Perm()&0o044 == 0 {
		return ""
	}
	return fmt.Sprintf("the CURVE secret key file %s is readable by others than its owner (mode %#o): whoever reads it can pose as this engine; chmod 600 %s", path, fi.Mode().Perm(), path)
}

// ReadPublicKey reads a peer's public key (--peer-key). A secret key file
// is refused: a peer's secret key has no business here, and holding it
// means it leaked. So is a bare key in a file named *.key.
func ReadPublicKey(path string) (string, error) {
	kf, err := ReadKeyFile(path)
	if err != nil {
		return "", err
	}
	switch {
	case kf.Kind == KeySecret:
		return "", fmt.Errorf("%w %s holds a CURVE secret key: --peer-key wants the peer's public key file (PREFIX.pub); keep the secret key with the engine it belongs to", ErrKeyFile, path)
	case kf.Kind == KeyBare && strings.HasSuffix(path, ".key"):
		return "", fmt.Errorf("%w %s is named as a secret key file: --peer-key wants the peer's public key file (PREFIX.pub); the file holds one bare key, the format before key files said which they hold, so rewrite the pair with kvxfer keygen if the name is wrong", ErrKeyFile, path)
	case kf.Kind == KeyBare:
		return kf.Secret, nil
	}
	return kf.Public, nil
}

// parseKeyFile parses a key file; why says what is wrong ("" when fine).
func parseKeyFile(b []byte) (KeyFile, string) {
	if tok := string(bytes.TrimSpace(b)); len(tok) == keyLen && !strings.ContainsAny(tok, " \t\r\n") {
		if why := checkZ85(tok); why != "" {
			return KeyFile{}, why
		}
		return KeyFile{Kind: KeyBare, Secret: tok}, ""
	}
	var kf KeyFile
	section, line := "", 0
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		line++
		text := strings.TrimRight(sc.Text(), " \t\r")
		trimmed := strings.TrimLeft(text, " \t")
		if trimmed == "" || strings.HasPrefix(trimmed, "#") {
			continue
		}
		name, value, isEntry := strings.Cut(trimmed, "=")
		if trimmed == text { // a top-level section
			if isEntry {
				return KeyFile{}, fmt.Sprintf("line %d: %q outside a section (want a ZeroMQ certificate, or one bare Z85 key)", line, trimmed)
			}
			section = trimmed
			continue
		}
		if section != "curve" || !isEntry {
			continue // metadata, or nested sections we do not read
		}
		name, value = strings.TrimSpace(name), strings.Trim(strings.TrimSpace(value), `"`)
		var dst *string
		switch name {
		case "public-key":
			dst = &kf.Public
		case "secret-key":
			dst = &kf.Secret
		default:
			continue
		}
		if why := checkZ85(value); why != "" {
			return KeyFile{}, fmt.Sprintf("line %d: %s: %s", line, name, why)
		}
		*dst = value
	}
	switch {
	case kf.Secret != "":
		kf.Kind = KeySecret
	case kf.Public != "":
		kf.Kind = KeyPublic
	default:
		return KeyFile{}, "no public-key or secret-key in a curve section (want a key file from kvxfer keygen, or one bare Z85 key of 40 characters)"
	}
	return kf, ""
}

// checkZ85 says why key is not a Z85 CURVE key ("" when it is).
func checkZ85(key string) string {
	if len(key) != keyLen {
		return fmt.Sprintf("a key of %d characters, want %d (Z85)", len(key), keyLen)
	}
	for i := 0; i < len(key); i++ {
		if !strings.ContainsRune(z85, rune(key[i])) {
			return fmt.Sprintf("character %q at %d is not Z85", key[i], i)
		}
	}
	return ""
}

// CheckKeyPrefix says why prefix cannot name a key pair (nil when it
// can): an empty prefix, or one that names a directory (ending in a path
// separator, or "." or ".."), would write hidden files such as dir/.key.
func CheckKeyPrefix(prefix string) error {
	base := filepath.Base(prefix)
	switch {
	case prefix == "":
		return fmt.Errorf("%w prefix is empty: want a path prefix such as ctx or keys/ctx (writes PREFIX.key and PREFIX.pub)", ErrKeyFile)
	case strings.HasSuffix(prefix, "/") || strings.HasSuffix(prefix, string(filepath.Separator)) || base == "." || base == "..":
		return fmt.Errorf("%w prefix %q names a directory: it would write the hidden files %s and %s; want a path prefix such as %s",
			ErrKeyFile, prefix, prefix+".key", prefix+".pub", filepath.Join(prefix, "ctx"))
	}
	return nil
}

// WriteKeyPair writes PREFIX.key (the secret key file, mode 0600) and
// PREFIX.pub (the public key file, mode 0644) and returns their paths. It
// refuses a prefix CheckKeyPrefix refuses. Unless force, it refuses to
// overwrite either file, naming it, before writing any, and a file that
// appears meanwhile is not replaced (O_EXCL; a secret key written before
// its public key was refused is removed). With force, both are written to
// temporary files beside them and renamed over the old ones only once
// both are written: a failure leaves the old pair, and a key file that is
// a symbolic link is replaced by a file, its target left alone; a key
// path that is a directory or other non-file is refused before writing.
func WriteKeyPair(prefix, public, secret string, force bool) (secretPath, publicPath string, err error) {
	if err := CheckKeyPrefix(prefix); err != nil {
		return "", "", err
	}
	secretPath, publicPath = prefix+".key", prefix+".pub"
	for _, p := range []string{secretPath, publicPath} {
		fi, err := os.Lstat(p)
		switch {
		case errors.Is(err, fs.ErrNotExist):
		case err != nil:
			return "", "", fmt.Errorf("%w: %w", ErrKeyFile, err)
		case !force:
			return "", "", fmt.Errorf("%w %s exists: not overwriting a key (--force overwrites it; peers that hold the old public key would no longer admit this engine)", ErrKeyFile, p)
		case !fi.Mode().IsRegular() && fi.Mode()&fs.ModeSymlink == 0:
			return "", "", fmt.Errorf("%w %s is not a file (%v): not replacing it with a key", ErrKeyFile, p, fi.Mode().Type())
		}
	}
	secretBody, publicBody := FormatSecretKeyFile(public, secret), FormatPublicKeyFile(public)
	if !force {
		if err := createKeyFile(secretPath, secretBody, 0o600); err != nil {
			return "", "", err
		}
		if err := createKeyFile(publicPath, publicBody, 0o644); err != nil {
			_ = os.Remove(secretPath) // ours: created above, O_EXCL
			return "", "", err
		}
		return secretPath, publicPath, nil
	}
	secretTmp, err := writeTempKeyFile(secretPath, secretBody, 0o600)
	if err != nil {
		return "", "", err
	}
	defer os.Remove(secretTmp) // gone once renamed
	publicTmp, err := writeTempKeyFile(publicPath, publicBody, 0o644)
	if err != nil {
		return "", "", err
	}
	defer os.Remove(publicTmp)
	if err := os.Rename(secretTmp, secretPath); err != nil {
		return "", "", fmt.Errorf("%w: %w", ErrKeyFile, err)
	}
	if err := os.Rename(publicTmp, publicPath); err != nil {
		return "", "", fmt.Errorf("%w: %s holds the new secret key but %s could not be replaced, so the two do not match: run kvxfer keygen --force again: %w", ErrKeyFile, secretPath, publicPath, err)
	}
	return secretPath, publicPath, nil
}

// createKeyFile writes a new key file; it never replaces a file (O_EXCL),
// even one created since WriteKeyPair looked.
func createKeyFile(path string, body []byte, mode os.FileMode) error {
	f, err := os.OpenFile(filepath.Clean(path), os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("%w %s exists: not overwriting a key (--force overwrites it)", ErrKeyFile, path)
	}
	if err != nil {
		return fmt.Errorf("%w: %w", ErrKeyFile, err)
	}
	if _, err := f.Write(body); err != nil {
		_ = f.Close()
		_ = os.Remove(path)
		return fmt.Errorf("%w: %w", ErrKeyFile, err)
	}
	if err := f.Close(); err != nil {
		_ = os.Remove(path)
		return fmt.Errorf("%w: %w", ErrKeyFile, err)
	}
	return nil
}

// writeTempKeyFile writes body, with mode, to a new temporary file in
// path's directory and returns its name (removed again on failure).
func writeTempKeyFile(path string, body []byte, mode os.FileMode) (string, error) {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*.tmp")
	if err != nil {
		return "", fmt.Errorf("%w: %w", ErrKeyFile, err)
	}
	_, err = f.Write(body)
	if err == nil {
		err = f.Chmod(mode) // CreateTemp's is 0600
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		_ = os.Remove(f.Name())
		return "", fmt.Errorf("%w: %w", ErrKeyFile, err)
	}
	return f.Name(), nil
}
