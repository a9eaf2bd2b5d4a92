/* Stand-in for python.exe and powershell.exe in the launcher tests.
 *
 * The tests compile it with MinGW and run tools\*.bat under wine's cmd with
 * it on PATH. A real executable (not a .bat) is needed: cmd returns from an
 * .exe with its exit code, but never from a batch file started without
 * "call". Each call appends one JSON line to %MMSAFE_STUB_RECORD%: the
 * stand-in's name, its arguments, working directory, own path and the
 * environment the launchers set. Behaviour follows the arguments:
 *
 *   python -m venv DIR        creates DIR\Scripts\python.exe (this program)
 *                             and DIR\Scripts\activate.bat (a copy of
 *                             %MMSAFE_STUB_DIR%\activate.bat)
 *   python -c CODE            answers "import torch|mmcv|mmsafe" from the
 *                             marker files installed-<name> of its venv;
 *                             prints an mmcv wheel index URL when asked
 *   python -m pip install ... writes those markers; exits 1 when an argument
 *                             contains %MMSAFE_STUB_FAIL%
 *   python tools\train.py ... exits %MMSAFE_STUB_TRAIN_RC% (default 0); when
 *                             non-zero, first writes a 60-line log in
 *                             <work dir>\20260101_000000\
 *   powershell -Command "... -Path 'DIR' ... -Tail N"
 *                             prints the last N lines of the newest *.log
 *                             under DIR
 */
#include <windows.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_ARGS 64

static int argc;
static char *argv[MAX_ARGS];
static char exe[MAX_PATH];

/* Windows rules, simplified: blanks separate, double quotes group. */
static void split(const char *line) {
  static char buf[32768];
  char *out = buf;
  const char *p = line;
  while (*p && argc < MAX_ARGS) {
    while (*p == ' ' || *p == '\t') p++;
    if (!*p) break;
    int quoted = 0;
    argv[argc++] = out;
    while (*p && (quoted || (*p != ' ' && *p != '\t'))) {
      if (*p == '"') quoted = !quoted; else *out++ = *p;
      p++;
    }
    *out++ = '\0';
  }
}

static void json_string(FILE *f, const char *s) {
  fputc('"', f);
  if (s) {
    for (; *s; s++) {
      if (*s == '"' || *s == '\\') fprintf(f, "\\%c", *s);
      else if ((unsigned char)*s < 0x20) fprintf(f, "\\u%04x", *s);
      else fputc(*s, f);
    }
  }
  fputc('"', f);
}

static const char *env(const char *name) {
  static char values[8][4096];
  static int next;
  char *v = values[next++ % 8];
  DWORD n = GetEnvironmentVariableA(name, v, 4096);
  return (n == 0 || n >= 4096) ? NULL : v;
}

static void record(const char *name) {
  static const char *keys[] = {"PYTHONUTF8", "PYTHONIOENCODING",
                               "VIRTUAL_ENV", "MMSAFE_STUB_CODEPAGE",
                               "MMCV_WITH_OPS"};
  char cwd[MAX_PATH];
  const char *path = env("MMSAFE_STUB_RECORD");
  FILE *f;
  int i;
  if (!path || !(f = fopen(path, "ab"))) {
    fprintf(stderr, "stand-in %s: cannot append to MMSAFE_STUB_RECORD\n",
            name);
    exit(90);
  }
  GetCurrentDirectoryA(MAX_PATH, cwd);
  fputs("{\"name\": ", f); json_string(f, name);
  fputs(", \"args\": [", f);
  for (i = 1; i < argc; i++) {
    if (i > 1) fputs(", ", f);
    json_string(f, argv[i]);
  }
  fputs("], \"cwd\": ", f); json_string(f, cwd);
  fputs(", \"exe\": ", f); json_string(f, exe);
  fputs(", \"env\": {", f);
  for (i = 0; i < 5; i++) {
    const char *v = env(keys[i]);
    if (i) fputs(", ", f);
    json_string(f, keys[i]); fputs(": ", f);
    if (v) json_string(f, v); else fputs("null", f);
  }
  fputs("}}\n", f);
  fclose(f);
}

static void venv_file(char *out, const char *file) {
  /* <venv>\Scripts\python.exe -> <venv>\<file> */
  strcpy(out, exe);
  *strrchr(out, '\\') = '\0';
  *strrchr(out, '\\') = '\0';
  strcat(out, "\\");
  strcat(out, file);
}

static int imports(const char *code, const char *module) {
  char pattern[64];
  const char *hit;
  snprintf(pattern, sizeof pattern, "import %s", module);
  for (hit = strstr(code, pattern); hit; hit = strstr(hit + 1, pattern)) {
    char next = hit[strlen(pattern)];
    if (!(next == '_' || (next >= 'a' && next <= 'z') ||
          (next >= '0' && next <= '9')))
      return 1;
  }
  return 0;
}

static void touch(const char *path) {
  FILE *f = fopen(path, "wb");
  if (f) fclose(f);
}

static int copy_failed(const char *src, const char *dst) {
  fprintf(stderr, "stand-in python: copying %s to %s failed (error %lu)\n",
          src, dst, GetLastError());
  return 91;
}

static int python(void) {
  static const char *modules[] = {"mmsafe", "mmcv", "torch"};
  char path[MAX_PATH], src[MAX_PATH];
  const char *fail = env("MMSAFE_STUB_FAIL");
  int i, j;
  if (argc >= 4 && !strcmp(argv[1], "-m") && !strcmp(argv[2], "venv")) {
    CreateDirectoryA(argv[3], NULL);
    snprintf(path, MAX_PATH, "%s\\Scripts", argv[3]);
    CreateDirectoryA(path, NULL);
    snprintf(path, MAX_PATH, "%s\\Scripts\\python.exe", argv[3]);
    if (!CopyFileA(exe, path, FALSE)) return copy_failed(exe, path);
    snprintf(src, MAX_PATH, "%s\\activate.bat", env("MMSAFE_STUB_DIR"));
    snprintf(path, MAX_PATH, "%s\\Scripts\\activate.bat", argv[3]);
    return CopyFileA(src, path, FALSE) ? 0 : copy_failed(src, path);
  }
  if (argc >= 3 && !strcmp(argv[1], "-c")) {
    const char *code = argv[2];
    if (strstr(code, "download.openmmlab.com")) {
      puts("https://download.openmmlab.com/mmcv/dist/cpu/torch2.13/"
           "index.html");
      return 0;
    }
    for (i = 0; i < 3; i++) {
      char marker[64];
      if (!imports(code, modules[i])) continue;
      snprintf(marker, sizeof marker, "installed-%s", modules[i]);
      venv_file(path, marker);
      if (GetFileAttributesA(path) == INVALID_FILE_ATTRIBUTES) {
        fprintf(stderr, "ModuleNotFoundError: No module named '%s'\n",
                modules[i]);
        return 1;
      }
    }
    if (strstr(code, "print(")) puts("[setup_env] ok: (stand-in)");
    return 0;
  }
  if (argc >= 4 && !strcmp(argv[1], "-m") && !strcmp(argv[2], "pip") &&
      !strcmp(argv[3], "install")) {
    for (i = 4; i < argc; i++) {
      if (fail && strstr(argv[i], fail)) {
        fprintf(stderr, "ERROR: could not install %s (stand-in)\n", fail);
        return 1;
      }
    }
    for (i = 4; i < argc; i++) {
      static const char *hints[] = {"-e", "mmcv==", "torch=="};
      for (j = 0; j < 3; j++) {
        char marker[64];
        if (strncmp(argv[i], hints[j], strlen(hints[j]))) continue;
        if (j == 0 && strcmp(argv[i], "-e")) continue;
        snprintf(marker, sizeof marker, "installed-%s", modules[j]);
        venv_file(path, marker);
        touch(path);
      }
    }
    return 0;
  }
  if (argc >= 2 && !strcmp(argv[1], "tools\\train.py")) {
    const char *rc = env("MMSAFE_STUB_TRAIN_RC");
    int code = rc ? atoi(rc) : 0;
    if (code) {
      FILE *f;
      for (i = 2; i + 1 < argc && strcmp(argv[i], "--work-dir"); i++) {}
      snprintf(path, MAX_PATH, "%s\\20260101_000000", argv[i + 1]);
      CreateDirectoryA(argv[i + 1], NULL);
      CreateDirectoryA(path, NULL);
      strcat(path, "\\20260101_000000.log");
      f = fopen(path, "wb");
      for (j = 1; j <= 60; j++) fprintf(f, "log line %d\r\n", j);
      fclose(f);
      fprintf(stderr, "RuntimeError: injected training failure\n");
    }
    return code;
  }
  return 0;
}

static void newest_log(const char *dir, char *best, FILETIME *best_time) {
  char pattern[MAX_PATH], path[MAX_PATH];
  WIN32_FIND_DATAA d;
  HANDLE h;
  snprintf(pattern, MAX_PATH, "%s\\*", dir);
  h = FindFirstFileA(pattern, &d);
  if (h == INVALID_HANDLE_VALUE) return;
  do {
    size_t n = strlen(d.cFileName);
    if (!strcmp(d.cFileName, ".") || !strcmp(d.cFileName, "..")) continue;
    snprintf(path, MAX_PATH, "%s\\%s", dir, d.cFileName);
    if (d.dwFileAttributes & FILE_ATTRIBUTE_DIRECTORY) {
      newest_log(path, best, best_time);
    } else if (n > 4 && !_stricmp(d.cFileName + n - 4, ".log") &&
               CompareFileTime(&d.ftLastWriteTime, best_time) >= 0) {
      strcpy(best, path);
      *best_time = d.ftLastWriteTime;
    }
  } while (FindNextFileA(h, &d));
  FindClose(h);
}

static int powershell(void) {
  const char *command = NULL, *p, *q;
  char dir[MAX_PATH], best[MAX_PATH] = "";
  static char text[1 << 20];
  FILETIME t = {0, 0};
  size_t n;
  int i, tail, lines = 0;
  FILE *f;
  for (i = 1; i + 1 < argc; i++)
    if (!strcmp(argv[i], "-Command")) command = argv[i + 1];
  if (!command || !(p = strstr(command, "-Path '")) ||
      !(q = strchr(p + 7, '\'')) || !strstr(command, "-Recurse") ||
      !strstr(command, "-Filter *.log") || !strstr(command, "-Tail ")) {
    fprintf(stderr, "stand-in powershell: unexpected command\n");
    return 93;
  }
  snprintf(dir, MAX_PATH, "%.*s", (int)(q - p - 7), p + 7);
  tail = atoi(strstr(command, "-Tail ") + 6);
  newest_log(dir, best, &t);
  if (!*best || !(f = fopen(best, "rb"))) return 0;
  n = fread(text, 1, sizeof text - 1, f);
  fclose(f);
  text[n] = '\0';
  for (i = (int)n - 1; i >= 0; i--)
    if (text[i] == '\n' && i != (int)n - 1 && ++lines == tail) break;
  fputs(text + i + 1, stdout);
  return 0;
}

int main(void) {
  char name[MAX_PATH], *base, *dot;
  GetModuleFileNameA(NULL, exe, MAX_PATH);
  split(GetCommandLineA());
  base = strrchr(exe, '\\');
  strcpy(name, base ? base + 1 : exe);
  if ((dot = strrchr(name, '.'))) *dot = '\0';
  CharLowerA(name);
  record(name);
  fflush(stdout);
  if (!strcmp(name, "python")) return python();
  if (!strcmp(name, "powershell")) return powershell();
  return 0;
}
