#include "base/folder.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace harp {

FolderState inspectFolder(const std::string& dir, uid_t owner) {
  FolderState s;
  struct stat st;
  if (::lstat(dir.c_str(), &st) != 0) {
    s.err = errno;
    return s;
  }
  s.uid = static_cast<unsigned>(st.st_uid);
  s.mode = static_cast<unsigned>(st.st_mode & 07777);
  if (S_ISLNK(st.st_mode)) s.kind = FolderState::kSymlink;
  else if (!S_ISDIR(st.st_mode)) s.kind = FolderState::kNotFolder;
  else if (st.st_uid != owner) s.kind = FolderState::kOtherOwner;
  else if (st.st_mode & 077) s.kind = FolderState::kOpen;
  else s.kind = FolderState::kPrivate;
  return s;
}

std::string describe(const FolderState& s) {
  char b[160];
  switch (s.kind) {
    case FolderState::kPrivate: return "private";
    case FolderState::kMissing: return std::strerror(s.err);
    case FolderState::kSymlink: return "a symbolic link";
    case FolderState::kNotFolder: return "not a folder";
    case FolderState::kOtherOwner: snprintf(b, sizeof b, "owned by uid %u", s.uid); return b;
    case FolderState::kOpen: snprintf(b, sizeof b, "mode %04o (others have access)", s.mode); return b;
  }
  return "?";
}

bool isPrivateFolder(const std::string& dir, std::string* why) {
  FolderState s = inspectFolder(dir, getuid());
  if (s.kind == FolderState::kPrivate) return true;
  if (why) *why = describe(s);
  return false;
}

std::string privateFolder(const std::string& base, const std::string& name, std::string* note) {
  std::string dir = base + "/" + name, why;
  ::mkdir(dir.c_str(), 0700);  // EEXIST is fine: what is there is checked next
  if (isPrivateFolder(dir, &why)) return dir;
  std::string tmpl = dir + ".XXXXXX";
  std::vector<char> t(tmpl.begin(), tmpl.end());
  t.push_back('\0');
  if (!::mkdtemp(t.data())) {
    if (note) *note = dir + " is " + why + ", and " + tmpl + ": " + std::strerror(errno);
    return "";
  }
  if (note) *note = dir + " is " + why + " (made by someone else?): using " + t.data() + " instead";
  return t.data();
}

}  // namespace harp
