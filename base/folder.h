// Private folders: where HARP keeps files and sockets that other local users
// must not plant, read or reach (flight-record dumps, status sockets, memif
// sockets).
//
//   FolderState s = inspectFolder(dir, geteuid());
//   if (s.kind != FolderState::kPrivate) refuse(dir + " is " + describe(s));
//
// A folder is private when it is a real folder (lstat: not a symlink), owned by
// the given uid, with no group or other permission bits. Callers word their own
// errors from the kind; describe() gives the short standard phrase.
// Threading: none of these keep state; any thread.
#pragma once

#include <sys/types.h>

#include <string>

namespace harp {

struct FolderState {
  enum Kind { kPrivate, kMissing, kSymlink, kNotFolder, kOtherOwner, kOpen } kind = kMissing;
  int err = 0;        // kMissing: errno of lstat
  unsigned uid = 0;   // the owner found
  unsigned mode = 0;  // the permission bits found (07777)
};

FolderState inspectFolder(const std::string& dir, uid_t owner);
// "a symbolic link", "owned by uid N", "mode 0777 (others have access)", ...
std::string describe(const FolderState& s);

// A folder only this user (getuid()) can enter; else false with *why set (describe()).
bool isPrivateFolder(const std::string& dir, std::string* why);
// <base>/<name>, made 0700 if missing, when it is private; when someone else
// made that name first, a fresh mkdtemp <base>/<name>.XXXXXX (harp-status
// looks there too), with *note saying so. "" with *note set when neither works.
std::string privateFolder(const std::string& base, const std::string& name, std::string* note);

}  // namespace harp
