// First part of the native-f16 expert-projection modules.
enable f16;
