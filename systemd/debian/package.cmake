# The Debian package, built by CPack from an existing build tree (`scripts/package`):
# everything `cmake --install` puts in place, for the /usr prefix, plus maintainer
# scripts that create the service user and enable the socket.

set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME colibri)
set(CPACK_PACKAGE_VENDOR "Colibri")
set(CPACK_PACKAGE_CONTACT "Colibri maintainers <colibri@localhost>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "${PROJECT_DESCRIPTION}")
set(CPACK_PACKAGE_DESCRIPTION
    "colibrid keeps a Mixture-of-Experts code model warm in a supervised worker process\nand answers completion requests on a Unix socket, as a systemd service started on\ndemand. Includes colibri-client, the colibri and colibri-convert tools and a small\ndefault model.")
# Install rules run with DESTDIR set to the staging root and CMAKE_INSTALL_PREFIX=/usr,
# so that the units name /usr/bin/colibrid and the config lands in /etc.
set(CPACK_SET_DESTDIR ON)
set(CPACK_INSTALL_PREFIX /usr)
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_STRIP_FILES ON)
set(CPACK_DEBIAN_PACKAGE_SECTION devel)
set(CPACK_DEBIAN_PACKAGE_PRIORITY optional)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
# useradd/groupadd for the service user.
set(CPACK_DEBIAN_PACKAGE_DEPENDS "passwd")
set(CPACK_DEBIAN_PACKAGE_RECOMMENDS "systemd")
set(CPACK_DEBIAN_PACKAGE_CONTROL_EXTRA
    ${CMAKE_CURRENT_LIST_DIR}/postinst ${CMAKE_CURRENT_LIST_DIR}/prerm ${CMAKE_CURRENT_LIST_DIR}/postrm
    ${CMAKE_CURRENT_LIST_DIR}/conffiles)
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)
include(CPack)
